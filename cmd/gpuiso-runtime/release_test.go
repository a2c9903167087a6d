package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestVolumeWithoutStateDir: without --state-dir nothing is claimed, but a
// container's use of the driver volume is still given back: after a
// foreground "run" that ended, and on the delete of a created container.
func TestVolumeWithoutStateDir(t *testing.T) {
	r := newRig(t)
	global := []string{"--simulate", "dgx1-volta", "--dev-root", r.sim, "--root", r.root, "--accept-env-request", "always"}
	ctx := context.Background()

	ran := fmt.Sprintf("gpuiso-volrun-%d", time.Now().UnixNano())
	forgetContainer(t, ran, r.root)
	b := sleepBundle(t, r.probe, "6")
	setArgs(t, b, "/probe", "exit", "0")
	if out, err := runtimeOut(t, r.bin, append(global, "run", "--bundle", b, ran)...); err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if owner := r.owner(t, ran, r.root); usesVolume(ctx, owner) {
		t.Errorf("%s still uses the driver volume after its run ended", owner)
	}

	created := fmt.Sprintf("gpuiso-volcreate-%d", time.Now().UnixNano())
	forgetContainer(t, created, r.root)
	if out, err := runtimeOut(t, r.bin, append(global, "create", "--bundle", sleepBundle(t, r.probe, "6"), created)...); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	owner := r.owner(t, created, r.root)
	if !usesVolume(ctx, owner) {
		t.Errorf("%s does not use the driver volume", owner)
	}
	if out, err := runtimeOut(t, r.bin, append(global, "delete", "--force", created)...); err != nil {
		t.Fatalf("delete: %v\n%s", err, out)
	}
	if usesVolume(ctx, owner) {
		t.Errorf("%s still uses the driver volume after its delete", owner)
	}
}
