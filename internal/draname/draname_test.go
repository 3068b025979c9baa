package draname

import "testing"

func TestDeviceName(t *testing.T) {
	for _, tc := range []struct {
		name  string
		index int
	}{
		{"gpu-0", 0},
		{"gpu-7", 7},
		{"gpu-123", 123},
		{"gpu-03", -1},
		{"gpu--1", -1},
		{"gpu-+1", -1},
		{"gpu-", -1},
		{"mig-1", -1},
		{"3", -1},
	} {
		if got := DeviceIndex(tc.name); got != tc.index {
			t.Errorf("DeviceIndex(%q) = %d, want %d", tc.name, got, tc.index)
		}
		if tc.index >= 0 {
			if got := DeviceName(tc.index); got != tc.name {
				t.Errorf("DeviceName(%d) = %q, want %q", tc.index, got, tc.name)
			}
		}
	}
}

func FuzzDeviceIndex(f *testing.F) {
	for _, s := range []string{"gpu-0", "gpu-12", "gpu-01", "gpu-", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		i := DeviceIndex(name)
		if i < -1 {
			t.Fatalf("DeviceIndex(%q) = %d", name, i)
		}
		// Every name accepted is the one DeviceName makes: one name per GPU.
		if i >= 0 && DeviceName(i) != name {
			t.Fatalf("DeviceIndex(%q) = %d, but DeviceName(%d) = %q", name, i, i, DeviceName(i))
		}
	})
}
