package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// BenchmarkDockerRun times docker run --rm of the probe image through the
// gpuiso runtime against the same run through runc, in pairs (the order
// alternating), on a Docker daemon started for the benchmark, and reports
// the median of the pairs' ratios: for a container asking for nothing
// (passed through) and for one asking for 2 GPUs of a simulated node (spec
// edited, driver volume mounted).
//
//	sudo go test -run '^$' -bench DockerRun -benchtime 20x ./cmd/gpuiso-runtime
func BenchmarkDockerRun(b *testing.B) {
	testenv.RequireRoot(b)
	testenv.RequireNVIDIALibraries(b)
	bin := buildRuntime(b)
	sim, _, _ := simNode(b, "dgx1-volta")
	config := map[string]any{"runtimes": map[string]any{"gpuiso": map[string]any{"path": bin, "runtimeArgs": []string{"--simulate", "dgx1-volta", "--dev-root", sim}}}}
	d := testenv.StartDockerd(b, config)
	img := testenv.BuildProbeImage(b, d.Client, testenv.ProbeImage{})
	for _, bc := range []struct {
		name string
		env  []string
	}{
		{name: "no-gpu"},
		{name: "2-gpus", env: []string{"-e", "NVIDIA_VISIBLE_DEVICES=2,3"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			run := func(runtime string) time.Duration {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				args := append(append([]string{"run", "--rm", "--network", "none", "--runtime", runtime}, bc.env...), img, "exit")
				start := time.Now()
				if out, err := d.Docker(ctx, args...); err != nil {
					b.Fatalf("%v\n%s", err, out)
				}
				return time.Since(start)
			}
			run("runc") // warm the daemon and the volume
			run("gpuiso")
			var ratios []float64
			var gpuiso, runc time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var g, r time.Duration
				if i%2 == 0 {
					g, r = run("gpuiso"), run("runc")
				} else {
					r, g = run("runc"), run("gpuiso")
				}
				gpuiso += g
				runc += r
				ratios = append(ratios, float64(g)/float64(r))
			}
			b.StopTimer()
			slices.Sort(ratios)
			b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
			b.ReportMetric(float64(gpuiso.Milliseconds())/float64(b.N), "gpuiso-ms/run")
			b.ReportMetric(float64(runc.Milliseconds())/float64(b.N), "runc-ms/run")
			b.ReportMetric(0, "ns/op")
		})
	}
}
