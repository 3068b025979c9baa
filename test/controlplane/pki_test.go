package controlplane

import (
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/stretchr/testify/require"
)

// These run without binaries (also under -short).

func TestClientCertCarriesUserAndGroups(t *testing.T) {
	ca, err := newAuthority()
	require.NoError(t, err)
	certPEM, keyPEM, err := ca.issue("system:node:n1", []string{"system:nodes"}, false, nil, nil)
	require.NoError(t, err)
	require.NotEmpty(t, keyPEM)

	block, _ := pem.Decode(certPEM)
	require.NotNil(t, block)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	require.Equal(t, "system:node:n1", cert.Subject.CommonName)
	require.Equal(t, []string{"system:nodes"}, cert.Subject.Organization)

	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
}

func TestFeatureGatesMergeSorted(t *testing.T) {
	cp := &ControlPlane{opts: Options{FeatureGates: map[string]bool{"DRADeviceTaints": false, "Alpha": true}}}
	require.Equal(t, "Alpha=true,DRAConsumableCapacity=true,DRADeviceTaintRules=true,DRADeviceTaints=false", cp.featureGates())
}

func TestWorkloadAPIFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		gates   string
		runtime string
	}{
		{"not served", Options{}, "DRAConsumableCapacity=true,DRADeviceTaintRules=true,DRADeviceTaints=true", "resource.k8s.io/v1beta2=true"},
		{"served", Options{Workloads: WorkloadAPI{Serve: true}},
			"DRAConsumableCapacity=true,DRADeviceTaintRules=true,DRADeviceTaints=true,GenericWorkload=true",
			"resource.k8s.io/v1beta2=true,scheduling.k8s.io/v1beta1=true"},
		{"jobs imply served", Options{Workloads: WorkloadAPI{Jobs: true}},
			"DRAConsumableCapacity=true,DRADeviceTaintRules=true,DRADeviceTaints=true,GenericWorkload=true,WorkloadWithJob=true",
			"resource.k8s.io/v1beta2=true,scheduling.k8s.io/v1beta1=true"},
		{"preemption policy; FeatureGates win", Options{Workloads: WorkloadAPI{PreemptionPolicy: true}, FeatureGates: map[string]bool{"GenericWorkload": false}, RuntimeConfig: []string{"scheduling.k8s.io/v1beta1=false"}},
			"DRAConsumableCapacity=true,DRADeviceTaintRules=true,DRADeviceTaints=true,GenericWorkload=false,PodGroupPreemptionPolicy=true",
			"resource.k8s.io/v1beta2=true,scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1beta1=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := &ControlPlane{opts: tc.opts}
			require.Equal(t, tc.gates, cp.featureGates())
			require.Equal(t, tc.runtime, cp.runtimeConfig())
		})
	}
}
