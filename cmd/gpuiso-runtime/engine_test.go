package main

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// blob returns v as JSON and its sha256 hex digest.
func blob(t *testing.T, v any) ([]byte, string) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// imageConfigOf is an image configuration with env and labels.
func imageConfigOf(env []string, labels map[string]string) map[string]any {
	return map[string]any{"architecture": "amd64", "os": "linux", "config": map[string]any{"Env": env, "Labels": labels}}
}

const testID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// dockerTree lays out what Docker keeps of container testID under a data
// root, with a graph driver or (manifest) the containerd image store, and
// returns the bundle and the spec Docker would write.
func dockerTree(t *testing.T, env []string, labels, containerLabels map[string]string, c8d bool) (string, *specs.Spec) {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg, cfgHex := blob(t, imageConfigOf(env, labels))
	rec := map[string]any{"ID": testID, "Image": "sha256:" + cfgHex, "Driver": "overlay2", "Config": map[string]any{"Labels": containerLabels, "Env": []string{"MERGED=1"}}}
	bundle := filepath.Join(dir, "x", "containerd", "daemon", "io.containerd.runtime.v2.task", "moby", testID)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	if c8d {
		croot := filepath.Join(data, "containerd", "daemon")
		blobs := filepath.Join(croot, "io.containerd.content.v1.content", "blobs", "sha256")
		man, manHex := blob(t, map[string]any{"schemaVersion": 2, "config": map[string]any{"digest": "sha256:" + cfgHex}, "annotations": map[string]string{"org.example": "x"}})
		writeFile(t, filepath.Join(blobs, cfgHex), cfg)
		writeFile(t, filepath.Join(blobs, manHex), man)
		rec["Driver"] = "overlayfs"
		rec["Image"] = "sha256:" + manHex
		rec["ImageManifest"] = map[string]any{"digest": "sha256:" + manHex}
		if err := os.Symlink(filepath.Join(croot, "io.containerd.runtime.v2.task", "moby", testID), filepath.Join(bundle, "work")); err != nil {
			t.Fatal(err)
		}
	} else {
		writeFile(t, filepath.Join(data, "image", "overlay2", "imagedb", "content", "sha256", cfgHex), cfg)
	}
	b, _ := blob(t, rec)
	writeFile(t, filepath.Join(data, "containers", testID, "config.v2.json"), b)
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/proc", Source: "proc"},
		{Destination: "/etc/hostname", Source: filepath.Join(data, "containers", testID, "hostname")},
	}}
	return bundle, spec
}

// podmanTree lays out what Podman (containers/storage) keeps of container
// testID and its image, and returns the bundle.
func podmanTree(t *testing.T, env []string, annotations map[string]string) string {
	t.Helper()
	graph := t.TempDir()
	cfg, imageID := blob(t, imageConfigOf(env, nil))
	man, _ := blob(t, map[string]any{"schemaVersion": 2, "annotations": annotations})
	list, _ := blob(t, []map[string]any{{"id": strings.Repeat("f", 64), "image": strings.Repeat("e", 64)}, {"id": testID, "image": imageID}})
	writeFile(t, filepath.Join(graph, "overlay-containers", "containers.json"), list)
	images := filepath.Join(graph, "overlay-images", imageID)
	writeFile(t, filepath.Join(images, "="+base64.StdEncoding.EncodeToString([]byte("sha256:"+imageID))), cfg)
	writeFile(t, filepath.Join(images, "manifest"), man)
	bundle := filepath.Join(graph, "overlay-containers", testID, "userdata")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	return bundle
}

// TestEngineRecords: the image's own environment, labels and annotations
// are read from Docker's (graph driver and containerd image store) and
// Podman's files, found from the bundle and the spec's mounts.
func TestEngineRecords(t *testing.T) {
	env := []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"}
	for _, c8d := range []bool{false, true} {
		name := map[bool]string{false: "docker graph driver", true: "docker containerd store"}[c8d]
		t.Run(name, func(t *testing.T) {
			bundle, spec := dockerTree(t, env, map[string]string{"img": "1"}, map[string]string{"com.docker.swarm.task.id": "t1"}, c8d)
			r, err := findEngineRecord(bundle, testID, spec)
			if err != nil {
				t.Fatal(err)
			}
			if r.Engine != "docker" || !slices.Equal(r.ImageEnv, env) || r.ImageLabels["img"] != "1" || !r.swarmTask() {
				t.Errorf("record %+v", r)
			}
			if r.fromImage("NVIDIA_VISIBLE_DEVICES", "all") == "" || r.fromImage("NVIDIA_VISIBLE_DEVICES", "1") != "" || r.fromImage("X", "") != "" {
				t.Errorf("fromImage wrong for %v", r.ImageEnv)
			}
		})
	}
	t.Run("podman", func(t *testing.T) {
		bundle := podmanTree(t, env, map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=all"})
		r, err := findEngineRecord(bundle, testID, &specs.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Engine != "podman" || !slices.Equal(r.ImageEnv, env) || r.ImageAnnotations["cdi.k8s.io/x"] != "nvidia.com/gpu=all" || r.swarmTask() {
			t.Errorf("record %+v", r)
		}
	})
	t.Run("no engine", func(t *testing.T) {
		if r, err := findEngineRecord(t.TempDir(), "c1", &specs.Spec{Mounts: []specs.Mount{{Destination: "/etc/hosts", Source: "/etc/hosts"}}}); r != nil || err == nil {
			t.Errorf("record %+v, %v; want none and why", r, err)
		}
	})
	t.Run("another container's mounts", func(t *testing.T) {
		bundle, spec := dockerTree(t, env, nil, nil, false)
		if r, err := findEngineRecord(bundle, strings.Repeat("a", 64), spec); r != nil || err == nil {
			t.Errorf("record %+v, %v; want none", r, err)
		}
	})
	t.Run("tampered image configuration", func(t *testing.T) {
		bundle, spec := dockerTree(t, env, nil, nil, false)
		data := filepath.Dir(filepath.Dir(filepath.Dir(spec.Mounts[1].Source)))
		matches, _ := filepath.Glob(filepath.Join(data, "image", "overlay2", "imagedb", "content", "sha256", "*"))
		writeFile(t, matches[0], []byte(`{"config":{"Env":[]}}`))
		if r, err := findEngineRecord(bundle, testID, spec); r != nil || err == nil || !strings.Contains(err.Error(), "digest") {
			t.Errorf("record %+v, %v; want a digest mismatch", r, err)
		}
	})
	t.Run("fifo for a record", func(t *testing.T) {
		bundle, spec := dockerTree(t, env, nil, nil, false)
		cfg := filepath.Join(filepath.Dir(spec.Mounts[1].Source), "config.v2.json")
		if err := os.Remove(cfg); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(cfg, 0o600); err != nil {
			t.Fatal(err)
		}
		if r, err := findEngineRecord(bundle, testID, spec); r != nil || err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("record %+v, %v; want not a regular file", r, err)
		}
	})
}
