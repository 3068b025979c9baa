package gpu

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// TestReadClique: the NVML path of the clique, on go-nvml's mock device as
// a GB200 and other GPUs answer.
func TestReadClique(t *testing.T) {
	cluster := uuid.MustParse("0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0")
	done := nvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: 32766, State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS)}
	with := func(f func(*nvml.GpuFabricInfo)) nvml.GpuFabricInfo {
		i := done
		f(&i)
		return i
	}
	for _, c := range []struct {
		name string
		info nvml.GpuFabricInfo
		ret  nvml.Return
		want string
		err  string
	}{
		{name: "registered", info: done, ret: nvml.SUCCESS, want: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.32766"},
		{name: "no multi-node NVLink", ret: nvml.ERROR_NOT_SUPPORTED},
		{name: "driver without the call", ret: nvml.ERROR_FUNCTION_NOT_FOUND},
		{name: "registration in progress", info: with(func(i *nvml.GpuFabricInfo) { i.State = nvml.GPU_FABRIC_STATE_IN_PROGRESS }), ret: nvml.SUCCESS},
		{name: "registration failed", info: with(func(i *nvml.GpuFabricInfo) { i.Status = uint32(nvml.ERROR_UNKNOWN) }), ret: nvml.SUCCESS},
		{name: "no cluster", info: with(func(i *nvml.GpuFabricInfo) { i.ClusterUuid = [16]uint8{} }), ret: nvml.SUCCESS},
		{name: "lost GPU", ret: nvml.ERROR_GPU_IS_LOST, err: "reading fabric info"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &mock.Device{GetGpuFabricInfoFunc: func() (nvml.GpuFabricInfo, nvml.Return) { return c.info, c.ret }}
			got, err := readClique(d)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

func TestParseClique(t *testing.T) {
	for _, c := range []struct{ in, err string }{
		{in: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.0"},
		{in: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.4294967295"},
		{in: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0", err: "is not <cluster UUID>.<clique ID>"},
		{in: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.-1", err: "clique ID \"-1\" is not a whole number"},
		{in: "7", err: "is not <cluster UUID>.<clique ID>"},
		{in: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.4294967296", err: "is not a whole number from 0 to 4294967295"},
		{in: "0f1e2d3c4b5a49788695a4b3c2d1e0f0.1", err: "is not a UUID like"},
		{in: "00000000-0000-0000-0000-000000000000.1", err: "all zeros"},
	} {
		cluster, id, err := ParseClique(c.in)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		require.Equal(t, c.in, FormatClique(cluster, id))
	}
}

// FuzzParseClique: what is accepted prints back as given; an error names
// the input.
func FuzzParseClique(f *testing.F) {
	for _, s := range []string{"0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.3", "x.1", ".", "0F1E2D3C-4B5A-4978-8695-A4B3C2D1E0F0.03", "urn:uuid:0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cluster, id, err := ParseClique(s)
		if err != nil {
			if !strings.Contains(err.Error(), "clique ") {
				t.Fatalf("error %q does not name the clique", err)
			}
			return
		}
		back := FormatClique(cluster, id)
		c2, id2, err := ParseClique(back)
		if err != nil || c2 != cluster || id2 != id || cluster == (uuid.UUID{}) {
			t.Fatalf("%q read as %s, %d; printed %q", s, cluster, id, back)
		}
		if !strings.EqualFold(back, s) && !strings.HasPrefix(s[strings.LastIndexByte(s, '.')+1:], "0") && !strings.HasPrefix(s[strings.LastIndexByte(s, '.')+1:], "+") {
			t.Fatalf("%q printed back as %q", s, back)
		}
	})
}

// TestFakeClique: gb200-nvl72 reports its clique through the NVML path;
// --fake-clique (WithFakeClique) picks another; other profiles have none.
func TestFakeClique(t *testing.T) {
	devs := func(profile string, opts ...Option) []Device {
		f, err := NewFake(profile, "tray-1", opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		d, err := f.Devices()
		require.NoError(t, err)
		return d
	}
	cliques := func(d []Device) []string {
		var out []string
		for _, g := range d {
			out = append(out, g.Clique)
		}
		return out
	}
	def := FakeClusterUUID.String() + ".1"
	d := devs("gb200-nvl72")
	require.Len(t, d, 4)
	require.Equal(t, []string{def, def, def, def}, cliques(d))
	require.Equal(t, "NVIDIA GB200", d[0].ProductName)
	three := FakeClusterUUID.String() + ".3"
	require.Equal(t, []string{three, three, three, three}, cliques(devs("gb200-nvl72", WithFakeClique("3"))))
	other := "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f0.9"
	require.Equal(t, other, devs("gb200-nvl72", WithFakeClique(other))[2].Clique)
	require.Equal(t, other, devs("h100-sxm-8", WithFakeClique(other))[7].Clique)
	require.Empty(t, devs("h100-sxm-8")[0].Clique)
	_, err := NewFake("gb200-nvl72", "tray-1", WithFakeClique("rack-a"))
	require.ErrorContains(t, err, `clique "rack-a" is not <cluster UUID>.<clique ID>`)

	_, err = ParseProfile([]byte("gpus: [{model: gb200-186gb}]\nclique: nope.1\n"))
	require.ErrorContains(t, err, `clique: clique "nope.1": cluster UUID "nope" is not a UUID`)
	p, err := ParseProfile([]byte("gpus: [{model: gb200-186gb, count: 4}]\nclique: " + other + "\n"))
	require.NoError(t, err)
	require.Equal(t, other, p.Clique)
}
