package node

import (
	"errors"
	"strings"
	"testing"
)

func TestParseMIGMinors(t *testing.T) {
	got, err := ParseMIGMinors("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\ngpu1/gi13/ci0/access 256\n")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint32{"config": 1, "monitor": 2, "gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4, "gpu1/gi13/ci0/access": 256}
	if len(got) != len(want) {
		t.Fatalf("ParseMIGMinors = %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
	if MIGGIAccessName(1, 13) != "gpu1/gi13/access" || MIGCIAccessName(1, 13, 0) != "gpu1/gi13/ci0/access" {
		t.Fatal("access names")
	}
	for _, bad := range []string{"config", "config 1 2", "gpu0/gi0/access x", "gpu0/gi0/access -1", "gpu0/gi0/access 99999999999"} {
		if _, err := ParseMIGMinors(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseMIGMinors(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestMIGProfileName(t *testing.T) {
	tests := []struct {
		slices int
		mib    uint64
		suffix string
		want   string
	}{
		{1, 9984, "", "1g.10gb"}, {1, 9984, "+me", "1g.10gb+me"}, {1, 20096, "", "1g.20gb"},
		{3, 40448, "", "3g.40gb"}, {7, 81152, "", "7g.80gb"}, {1, 4864, "", "1g.5gb"}, {7, 40192, "", "7g.40gb"},
	}
	for _, tt := range tests {
		if got := MIGProfileName(tt.slices, tt.mib<<20, tt.suffix); got != tt.want {
			t.Errorf("MIGProfileName(%d, %d MiB) = %q, want %q", tt.slices, tt.mib, got, tt.want)
		}
	}
}

func TestMIGPlacementOverlaps(t *testing.T) {
	a, b, c := MIGPlacement{0, 4}, MIGPlacement{4, 4}, MIGPlacement{2, 2}
	if a.Overlaps(b) || !a.Overlaps(c) || b.Overlaps(c) || !c.Overlaps(c) {
		t.Fatal("Overlaps")
	}
}

// TestDeviceCloneMIG: a clone shares no MIG data with the original.
func TestDeviceCloneMIG(t *testing.T) {
	d := Device{MIGProfiles: []MIGProfile{{Name: "1g.10gb", Placements: []MIGPlacement{{0, 1}}}}, MIGDevices: []MIGDevice{{UUID: "MIG-a"}}}
	c := d.Clone()
	c.MIGProfiles[0].Placements[0].Start = 5
	c.MIGDevices[0].UUID = "MIG-b"
	if d.MIGProfiles[0].Placements[0].Start != 0 || d.MIGDevices[0].UUID != "MIG-a" {
		t.Fatal("clone shares MIG data")
	}
	ref := d.MIGRef(d.MIGDevices[0])
	if ref.UUID != "MIG-a" || ref.MIG == nil || !IsMIGUUID(ref.UUID) || len(ref.MIG.CapNodes()) != 0 {
		t.Fatalf("MIGRef = %+v", ref)
	}
}

func FuzzParseMIGMinors(f *testing.F) {
	f.Add("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n")
	f.Add("gpu7/gi14/ci7/access 1082")
	f.Add(" \n\tconfig   1 \n")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMIGMinors(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not match ErrInvalid", err)
			}
			return
		}
		for k, v := range m {
			if k == "" || strings.ContainsAny(k, " \t\n") || v >= 1<<20 {
				t.Fatalf("entry %q %d", k, v)
			}
		}
	})
}
