package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// BenchmarkProcessVsRunc runs, paired in each iteration, the whole
// `gpurun --simulate dgx1-volta --gpus 1 -- probe exit 0` process and a
// `runc run` of the same static binary from a bundle of runc's default
// spec, and reports both medians and their ratio (gpurun/runc): what a user
// pays for a GPU container over Docker's runtime, start to exit.
func BenchmarkProcessVsRunc(b *testing.B) {
	testenv.RequireRoot(b)
	testenv.RequireDeviceCgroup(b)
	runc, err := exec.LookPath("runc")
	if err != nil {
		b.Skip("no runc")
	}
	dir := b.TempDir()
	gpurun := filepath.Join(dir, "gpurun")
	if out, err := exec.Command("go", "build", "-buildvcs=false", "-o", gpurun, ".").CombinedOutput(); err != nil {
		b.Fatalf("build gpurun: %v\n%s", err, out)
	}
	probe := testenv.BuildProbe(b)
	bundle := filepath.Join(dir, "bundle")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		b.Fatal(err)
	}
	bin, err := os.ReadFile(probe)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "probe"), bin, 0o755); err != nil {
		b.Fatal(err)
	}
	spec := exec.Command(runc, "spec")
	spec.Dir = bundle
	if out, err := spec.CombinedOutput(); err != nil {
		b.Fatalf("runc spec: %v\n%s", err, out)
	}
	var cfg map[string]any
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	proc := cfg["process"].(map[string]any)
	proc["args"], proc["terminal"] = []string{"/probe", "exit", "0"}, false
	if raw, err = json.Marshal(cfg); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o644); err != nil {
		b.Fatal(err)
	}
	timed := func(cmd *exec.Cmd) time.Duration {
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
		return time.Since(start)
	}
	var ours, theirs []time.Duration
	b.ResetTimer()
	for i := range b.N {
		ours = append(ours, timed(exec.Command(gpurun, "--simulate", "dgx1-volta", "--gpus", "1", "--quiet", "--", probe, "exit", "0")))
		theirs = append(theirs, timed(exec.Command(runc, "run", "--bundle", bundle, fmt.Sprintf("bench-%d-%d", os.Getpid(), i))))
	}
	b.StopTimer()
	median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	mo, mt := median(ours), median(theirs)
	b.ReportMetric(float64(mo.Microseconds())/1000, "gpurun-ms")
	b.ReportMetric(float64(mt.Microseconds())/1000, "runc-ms")
	b.ReportMetric(float64(mo)/float64(mt), "ratio")
}
