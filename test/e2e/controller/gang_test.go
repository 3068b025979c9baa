package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestGangWaitsForMinMemberPods: a PodGroup of minMember 3 with only two
// pods that can be scheduled binds none of them (the core read a minMember
// above the pods it was given as "all of them" and bound two: a half-bound
// gang); the third pod arriving lets the whole gang bind.
func TestGangWaitsForMinMemberPods(t *testing.T) {
	cp := cluster(t)
	e := newKillEnv(t, cp, "gangwait")
	createTemplate(t, e.client, e.ns, "one-gpu", 1)
	e.createGroup(t, "trio", 3)
	for i := range 2 {
		e.createPod(t, fmt.Sprintf("trio-%d", i), "trio", e.draPod)
	}
	r := startReplica(t, cp, "gangwait-replica", nil)
	eventually(t, "leading", 30*time.Second, func() (bool, string) { return r.c.IsLeader(), "not leader" })
	eventually(t, "the reason on the waiting pods", 30*time.Second, func() (bool, string) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(t.Context(), "trio-0", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				return strings.Contains(c.Message, "needs 3 pods together"), c.Message
			}
		}
		return false, "no PodScheduled=False"
	})
	if n := countBound(t, e.client, e.ns); n != 0 {
		t.Fatalf("%d pods of a gang of minMember 3 bound with only 2 pods", n)
	}
	e.createPod(t, "trio-2", "trio", e.draPod)
	eventually(t, "the whole gang bound", 60*time.Second, e.allBound)
	e.checkInvariants(t, true)
}
