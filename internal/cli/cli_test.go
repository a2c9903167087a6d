package cli

import (
	"errors"
	"flag"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
)

func TestExplainDiscover(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"library", &nvmlnode.NVMLError{Op: "init", Device: -1, Return: nvml.ERROR_LIBRARY_NOT_FOUND}, "libnvidia-ml.so.1 not found"},
		{"driver", fmt.Errorf("discover: %w", &nvmlnode.NVMLError{Op: "init", Device: -1, Return: nvml.ERROR_DRIVER_NOT_LOADED}), "driver not loaded"},
		{"other", errors.New("disk on fire"), "disk on fire"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ExplainDiscover(tt.err)
			if !strings.Contains(got, tt.want) || strings.Contains(got, "\n") {
				t.Fatalf("ExplainDiscover = %q, want one line with %q", got, tt.want)
			}
			if tt.name != "other" && !strings.Contains(got, "--simulate") {
				t.Fatalf("ExplainDiscover = %q does not suggest --simulate", got)
			}
		})
	}
}

func TestDescribeGPUs(t *testing.T) {
	if got := DescribeGPUs(nil); got != "no GPUs" {
		t.Fatalf("DescribeGPUs(nil) = %q", got)
	}
	got := DescribeGPUs([]node.DeviceRef{{Index: 1, UUID: "GPU-a"}, {Index: 3, UUID: "GPU-b"}})
	if got != "GPUs 1,3 (GPU-a,GPU-b)" {
		t.Fatalf("DescribeGPUs = %q", got)
	}
}

func TestStartStatus(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		code   int
		isExec bool
	}{
		{"nil", nil, 0, false},
		{"exec lookup", fmt.Errorf("start: %w", exec.ErrNotFound), ExitNotFound, true},
		{"runc not found", errors.New(`OCI runtime create failed: runc create failed: unable to start container process: exec: "nope": executable file not found in $PATH: unknown`), ExitNotFound, true},
		{"runc no such file", errors.New(`unable to start container process: exec: "/nope": stat /nope: no such file or directory`), ExitNotFound, true},
		{"runc permission", errors.New(`unable to start container process: exec: "/data": permission denied`), ExitCannotExecute, true},
		{"device missing is not the command", errors.New("lstat /dev/nvidia2: no such file or directory"), 0, false},
		{"other", errors.New("not enough free GPUs"), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, ok := StartStatus(tt.err)
			if code != tt.code || ok != tt.isExec {
				t.Fatalf("StartStatus = %d, %v; want %d, %v", code, ok, tt.code, tt.isExec)
			}
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name           string
		args           []string
		code           int
		done           bool
		stdout, stderr string
	}{
		{"help", []string{"--help"}, ExitOK, true, "usage: prog\n\nflags:\n  --gpus N\n    \tnumber of GPUs (default 1)\n  --quiet\n    \tsay less\n", ""},
		{"unknown flag", []string{"--bogus"}, ExitError, true, "", "prog: flag provided but not defined: --bogus (see prog --help)\n"},
		{"bad value", []string{"--gpus", "x"}, ExitError, true, "", "prog: invalid value \"x\" for flag --gpus: parse error (see prog --help)\n"},
		{"missing value", []string{"--gpus"}, ExitError, true, "", "prog: flag needs an argument: --gpus (see prog --help)\n"},
		{"fine", []string{"--gpus", "2"}, 0, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("prog", flag.ContinueOnError)
			fs.Int("gpus", 1, "number of GPUs")
			fs.Bool("quiet", false, "say less")
			var out, errOut strings.Builder
			code, done := Parse(fs, tt.args, "usage: prog\n", &out, &errOut)
			if code != tt.code || done != tt.done || out.String() != tt.stdout || errOut.String() != tt.stderr {
				t.Fatalf("Parse = %d, %v, stdout %q, stderr %q; want %d, %v, %q, %q", code, done, out.String(), errOut.String(), tt.code, tt.done, tt.stdout, tt.stderr)
			}
		})
	}
}

func TestCheckMIG(t *testing.T) {
	mig := &node.Inventory{Devices: []node.Device{
		{Index: 0, UUID: "GPU-a", MIG: node.MIGEnabled, MIGDevices: []node.MIGDevice{{UUID: "MIG-x", Profile: "1g.10gb"}}},
		{Index: 1, UUID: "GPU-b", MIG: node.MIGDisabled},
	}}
	plain := &node.Inventory{Devices: []node.Device{{Index: 0, UUID: "GPU-a", MIG: node.MIGUnsupported}}}
	tests := []struct {
		name    string
		inv     *node.Inventory
		profile string
		want    error
	}{
		{"present", mig, "1g.10gb", nil},
		{"unknown profile", mig, "bogus", node.ErrNotFound},
		{"no MIG node", plain, "1g.10gb", node.ErrNotSupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckMIG(tt.inv, tt.profile)
			if (tt.want == nil) != (err == nil) || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("CheckMIG = %v, want %v", err, tt.want)
			}
		})
	}
	if got := DescribeMIG(mig, []node.DeviceRef{{Index: 0, UUID: "MIG-x"}}); got != "MIG device 1g.10gb (MIG-x) of GPU 0 (GPU-a)" {
		t.Fatalf("DescribeMIG = %q", got)
	}
	if got := DescribeMIG(mig, []node.DeviceRef{{Index: 1, UUID: "GPU-b"}}); got != "GPUs 1 (GPU-b)" {
		t.Fatalf("DescribeMIG of a whole GPU = %q", got)
	}
}
