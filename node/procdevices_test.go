package node

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestReadProcDevices(t *testing.T) {
	tests := []struct {
		host string
		want map[string]uint32
		none []string
	}{
		{"dgx-a100", map[string]uint32{"nvidia-uvm": 236, "nvidia-frontend": 195, "nvidia-caps": 235, "mem": 1}, []string{"sd", "loop"}},
		{"no-driver", map[string]uint32{"pts": 136}, []string{"nvidia-uvm", "device-mapper"}},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			got, err := ReadProcDevices(filepath.Join("..", "testdata", "hosts", tt.host, "proc"))
			if err != nil {
				t.Fatal(err)
			}
			for name, major := range tt.want {
				if got[name] != major {
					t.Errorf("major of %s = %d, want %d", name, got[name], major)
				}
			}
			for _, name := range tt.none {
				if _, ok := got[name]; ok {
					t.Errorf("%s listed among character devices", name)
				}
			}
		})
	}
}

func TestParseProcDevicesRejects(t *testing.T) {
	for name, in := range map[string]string{
		"no major":  "Character devices:\nnvidia-uvm\n",
		"bad major": "Character devices:\nx nvidia-uvm\n",
		"huge":      "Character devices:\n99999999999 nvidia-uvm\n",
		"no name":   "Character devices:\n236 \n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseProcDevices(strings.NewReader(in)); err == nil {
				t.Fatalf("ParseProcDevices(%q) accepted", in)
			}
		})
	}
}
