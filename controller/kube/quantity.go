package kube

import (
	"errors"
	"fmt"
	"math"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tessera-gpu/tessera/controller/core"
)

// Every quantity the controller reads from outside (pod requests and
// overhead, fraction annotations, claim capacity requests, Queue quotas
// and limits, node allocatable, device capacity) goes through readAmount
// or clampAmount: resource.Quantity's Value and MilliValue wrap around
// above 2^63 ("9223372036854775808" reads as a negative number, "1e19" and
// "1e100" as 0), and the core refuses or miscounts what wrapped.

// errNegative is readAmount's error for an amount below zero.
var errNegative = errors.New("is negative")

// unit is how readAmount reads a quantity and writes its maximum.
type unit int

const (
	unitCount unit = iota // whole units, the maximum written in decimal
	unitBytes             // whole bytes, the maximum written in binary (64Ti)
	unitMilli             // thousandths (CPU, GPU shares of a queue)
)

// unitOf is the unit a pod's or node's resource is read in.
func unitOf(name v1.ResourceName) unit {
	switch {
	case name == v1.ResourceCPU:
		return unitMilli
	case name == v1.ResourceMemory || name == v1.ResourceEphemeralStorage || strings.HasPrefix(string(name), v1.ResourceHugePagesPrefix):
		return unitBytes
	}
	return unitCount
}

// readAmount reads q as an amount in the core's unit (u), rounded up as Kubernetes rounds, refusing a negative amount and
// one above most instead of wrapping. The error reads after the value
// ("cpu 1e30: is above ...").
func readAmount(q resource.Quantity, u unit, most int64) (int64, error) {
	if q.Sign() < 0 {
		return 0, errNegative
	}
	switch e := decimalExponent(q); {
	case e > 40:
		// Far above any maximum; compared exactly, "1e9999999" would build
		// a number of ten million digits (seconds of CPU per read).
		return 0, fmt.Errorf("is above the most Tessera accepts, %s", maxQuantityString(u, most))
	case e < -40 && q.Sign() > 0:
		return 1, nil // a tiny positive amount rounds up to one unit
	}
	if max := maxQuantity(u, most); q.Cmp(max) > 0 {
		return 0, fmt.Errorf("is above the most Tessera accepts, %s", max.String())
	}
	if u == unitMilli {
		return q.ScaledValue(resource.Milli), nil
	}
	return q.Value(), nil
}

// decimalExponent is the order of magnitude of q, found without building a
// power of ten: 10^(e-2) <= q < 10^e for e = decimalExponent(q) (q > 0).
func decimalExponent(q resource.Quantity) int64 {
	d := q.AsDec()
	digits := int64(float64(d.UnscaledBig().BitLen())*math.Log10(2)) + 1
	return digits - int64(d.Scale())
}

// maxQuantity is most as a quantity in the unit readAmount reads.
func maxQuantity(u unit, most int64) resource.Quantity {
	switch u {
	case unitMilli:
		return *resource.NewMilliQuantity(most, resource.DecimalSI)
	case unitBytes:
		return *resource.NewQuantity(most, resource.BinarySI)
	}
	return *resource.NewQuantity(most, resource.DecimalSI)
}

// maxQuantityString writes most as readAmount's error does.
func maxQuantityString(u unit, most int64) string {
	q := maxQuantity(u, most)
	return q.String()
}

// clampAmount reads a capacity (a node's allocatable, a device's memory, an
// allocation's consumed capacity) into [0, core.MaxAmount]: more than any
// pod may ask is as good as MaxAmount, and a negative capacity offers
// nothing. ok is false when it had to clamp.
func clampAmount(q resource.Quantity, u unit) (v int64, ok bool) {
	v, err := readAmount(q, u, core.MaxAmount)
	switch {
	case errors.Is(err, errNegative):
		return 0, false
	case err != nil:
		return core.MaxAmount, false
	}
	return v, true
}

// nodeAmount is a node's allocatable CPU (milli) or memory (bytes),
// clamped (clampAmount).
func nodeAmount(alloc v1.ResourceList, name v1.ResourceName) int64 {
	q, ok := alloc[name]
	if !ok {
		return 0
	}
	v, _ := clampAmount(q, unitOf(name))
	return v
}

// queueProblem says why a Queue or one of its ancestors cannot be read (""
// when all can): the queue and the queues under it are left out, and
// their pods wait with it.
func (idx *cycleIndex) queueProblem(name string) string {
	for i := 0; name != "" && i <= len(idx.queues); i++ {
		if why := idx.badQueues[name]; why != "" {
			return why
		}
		q := idx.queues[name]
		if q == nil {
			return ""
		}
		name = q.Spec.Parent
	}
	return ""
}
