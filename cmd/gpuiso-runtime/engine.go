package main

// What the engine that wrote a bundle keeps of the container's image.
//
// config.json holds the container's environment merged: the image's own
// variables and the ones its caller set (docker run -e, a Swarm task's
// DOCKER_RESOURCE_*) look alike, and Podman copies an image's manifest
// annotations into the spec's. Docker and Podman keep the image's own
// configuration in their storage, which the bundle leads to:
//
//   - Docker: the spec's /etc/hostname, /etc/hosts and /etc/resolv.conf (or
//     any other mount) come from DATA/containers/ID/, beside the container's
//     config.v2.json (its labels, and which image). The image's
//     configuration is DATA/image/DRIVER/imagedb/content/sha256/HEX with a
//     graph driver, or, with the containerd image store, the blobs of the
//     image's manifest in the content store of the containerd the bundle's
//     "work" link leads into.
//   - Podman: the bundle is GRAPH/DRIVER-containers/ID/userdata;
//     DRIVER-containers/containers.json names the image, whose
//     configuration and manifest are in DRIVER-images/IMAGE/.
//
// These are the engine's files, on the host, never the image's root file
// system; they are read with the same care (regular files only, bounded).

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// engineRecord is what an engine recorded of a container's image, and of
// the container where it keeps more than the spec says.
type engineRecord struct {
	// Engine is "docker" or "podman".
	Engine string
	// ImageEnv, ImageLabels and ImageAnnotations are the image's own
	// environment, labels and manifest annotations.
	ImageEnv         []string
	ImageLabels      map[string]string
	ImageAnnotations map[string]string
	// Labels are the container's labels (Docker: the image's merged with
	// the caller's and a Swarm task's).
	Labels map[string]string
}

// imageSetting is what an image's own environment makes of one variable of
// its container's, merged as the engine that recorded the image merges it.
type imageSetting struct {
	// Value is the value the image gives the variable, when Set.
	Value string
	Set   bool
	// Passed says that the engine fills the variable from its own
	// caller's environment because the image names it without a value
	// (Podman: "NAME", or "PREFIX*" for every variable of that prefix),
	// after any value the image gives it: whatever it holds then, the
	// image put it there.
	Passed bool
}

// imageSetting returns what the image's environment makes of key, as the
// record's engine reads an image's environment:
//
//   - Docker (either image store) keeps each "NAME=value" entry as it is
//     and appends it when the caller set no variable of that name: the
//     name is compared byte for byte, and an entry without "=" is dropped
//     (it can only unset the daemon's own PATH and HOSTNAME).
//   - Podman reads the entries into a map, the last one of a name
//     winning: it trims spaces and tabs from the front of each name (not
//     from its end, nor from the value), and an entry without "=" takes
//     the variable ("NAME") or every variable of a prefix ("PREFIX*")
//     from the environment of the podman process, its caller's.
//
// containerd keeps no record beside the bundle: there is no record, and
// nothing of the environment is told apart (see trust).
func (r *engineRecord) imageSetting(key string) imageSetting {
	var s imageSetting
	for _, kv := range r.ImageEnv {
		name, value, hasValue := strings.Cut(kv, "=")
		if r.Engine != "podman" {
			if hasValue && name == key {
				s.Value, s.Set = value, true
			}
			continue
		}
		name = strings.TrimLeft(name, " \t")
		switch prefix, glob := strings.CutSuffix(name, "*"); {
		case hasValue:
			if name == key {
				s = imageSetting{Value: value, Set: true}
			}
		case glob && strings.HasPrefix(key, prefix), !glob && name == key:
			s.Passed = true
		}
	}
	return s
}

// fromImage says why key=value in the container's environment is the
// image's doing: the image sets that very value, or has the engine take
// the variable from its caller's environment. "" when it is the caller's.
func (r *engineRecord) fromImage(key, value string) string {
	switch s := r.imageSetting(key); {
	case s.Passed:
		return "the image names " + key + " without a value, which " + r.Engine + " fills from its caller's environment"
	case s.Set && s.Value == value:
		return "the image's own setting"
	}
	return ""
}

// swarmTaskLabel is the label Docker's Swarm executor gives a task's
// container.
const swarmTaskLabel = "com.docker.swarm.task.id"

// swarmTask reports whether the container is a Docker Swarm task: its
// task label is the daemon's, not the image's.
func (r *engineRecord) swarmTask() bool {
	id := r.Labels[swarmTaskLabel]
	return r.Engine == "docker" && id != "" && r.ImageLabels[swarmTaskLabel] != id
}

// maxEngineFile bounds an engine file read (Podman's containers.json lists
// every container).
const maxEngineFile = 64 << 20

// readEngineFile reads the regular file path, at most max bytes; a FIFO or
// device is never opened for reading (O_NONBLOCK, then fstat).
func readEngineFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, nil
}

// readEngineJSON decodes the JSON file path into v.
func readEngineJSON(path string, v any) error {
	b, err := readEngineFile(path, maxEngineFile)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// readBlob reads the content-addressed blob digest ("sha256:HEX") of dir
// (files named HEX, or by name(HEX)) and checks its digest.
func readBlob(dir, digest string, name func(hex string) string) ([]byte, error) {
	h, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || !isHex64(h) {
		return nil, fmt.Errorf("digest %q: not sha256", digest)
	}
	b, err := readEngineFile(filepath.Join(dir, name(h)), 16<<20)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != h {
		return nil, fmt.Errorf("blob %s: content does not match its digest", digest)
	}
	return b, nil
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// imageConfig is what an image configuration (OCI or Docker) holds of
// interest.
type imageConfig struct {
	Config struct {
		Env    []string          `json:"Env"`
		Labels map[string]string `json:"Labels"`
	} `json:"config"`
}

// manifest is what an image manifest holds of interest.
type manifest struct {
	Config struct {
		Digest string `json:"digest"`
	} `json:"config"`
	Annotations map[string]string `json:"annotations"`
}

// findEngineRecord returns what the engine that wrote the bundle of
// container id recorded of its image: nil, with the reason, when the bundle
// is no Docker or Podman one, or their files cannot be read.
func findEngineRecord(bundle, id string, spec *specs.Spec) (*engineRecord, error) {
	if r, err := podmanRecord(bundle, id); r != nil || err != nil {
		return r, err
	}
	if r, err := dockerRecord(bundle, id, spec); r != nil || err != nil {
		return r, err
	}
	return nil, errors.New("no Docker or Podman record of the container's image")
}

// dockerRecord reads Docker's record of container id: its config.v2.json,
// found through the spec's mounts, and its image's configuration. nil, nil
// when no mount leads to one.
func dockerRecord(bundle, id string, spec *specs.Spec) (*engineRecord, error) {
	if !isHex64(id) {
		return nil, nil
	}
	seg := string(filepath.Separator) + filepath.Join("containers", id) + string(filepath.Separator)
	data := ""
	for _, m := range spec.Mounts {
		if i := strings.Index(m.Source, seg); filepath.IsAbs(m.Source) && i > 0 {
			data = m.Source[:i]
			break
		}
	}
	if data == "" {
		return nil, nil
	}
	var c struct {
		ID            string
		Image         string
		Driver        string
		ImageManifest *struct {
			Digest string `json:"digest"`
		}
		Config struct {
			Labels map[string]string
		}
	}
	if err := readEngineJSON(filepath.Join(data, "containers", id, "config.v2.json"), &c); err != nil {
		return nil, fmt.Errorf("docker's record: %w", err)
	}
	if c.ID != id {
		return nil, fmt.Errorf("docker's record: config.v2.json of %q, not %s", c.ID, id)
	}
	var cfg imageConfig
	var annotations map[string]string
	if c.ImageManifest != nil {
		// The containerd image store: the manifest's blobs in the content
		// store of the containerd whose task directory holds the bundle.
		work, err := os.Readlink(filepath.Join(bundle, "work"))
		if err != nil {
			return nil, fmt.Errorf("docker's record: the bundle's containerd: %w", err)
		}
		i := strings.Index(work, string(filepath.Separator)+"io.containerd.runtime.v2.task"+string(filepath.Separator))
		if !filepath.IsAbs(work) || i <= 0 {
			return nil, fmt.Errorf("docker's record: the bundle's work link %q leads to no containerd", work)
		}
		blobs := filepath.Join(work[:i], "io.containerd.content.v1.content", "blobs", "sha256")
		plain := func(h string) string { return h }
		b, err := readBlob(blobs, c.ImageManifest.Digest, plain)
		if err != nil {
			return nil, fmt.Errorf("docker's record: image manifest: %w", err)
		}
		var m manifest
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("docker's record: image manifest: %w", err)
		}
		if b, err = readBlob(blobs, m.Config.Digest, plain); err != nil {
			return nil, fmt.Errorf("docker's record: image configuration: %w", err)
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("docker's record: image configuration: %w", err)
		}
		annotations = m.Annotations
	} else {
		if c.Driver == "" || strings.ContainsAny(c.Driver, `/\`) || c.Driver == "." || c.Driver == ".." {
			return nil, fmt.Errorf("docker's record: storage driver %q", c.Driver)
		}
		dir := filepath.Join(data, "image", c.Driver, "imagedb", "content", "sha256")
		b, err := readBlob(dir, c.Image, func(h string) string { return h })
		if err != nil {
			return nil, fmt.Errorf("docker's record: image configuration: %w", err)
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("docker's record: image configuration: %w", err)
		}
	}
	return &engineRecord{Engine: "docker", ImageEnv: cfg.Config.Env, ImageLabels: cfg.Config.Labels,
		ImageAnnotations: annotations, Labels: c.Config.Labels}, nil
}

// podmanRecord reads Podman's (containers/storage's) record of container
// id's image. nil, nil when the bundle is not in such a store.
func podmanRecord(bundle, id string) (*engineRecord, error) {
	containers := filepath.Dir(filepath.Dir(bundle))
	driver, ok := strings.CutSuffix(filepath.Base(containers), "-containers")
	if filepath.Base(bundle) != "userdata" || filepath.Base(filepath.Dir(bundle)) != id || !ok || driver == "" || !isHex64(id) {
		return nil, nil
	}
	var list []struct {
		ID    string `json:"id"`
		Image string `json:"image"`
	}
	if err := readEngineJSON(filepath.Join(containers, "containers.json"), &list); err != nil {
		return nil, fmt.Errorf("podman's record: %w", err)
	}
	image := ""
	for _, c := range list {
		if c.ID == id {
			image = c.Image
		}
	}
	if !isHex64(image) {
		return nil, fmt.Errorf("podman's record: no image of container %s in containers.json", id)
	}
	dir := filepath.Join(filepath.Dir(containers), driver+"-images", image)
	// containers/storage names a big-data item "=" and its key in base64.
	bigData := func(key string) string { return "=" + base64.StdEncoding.EncodeToString([]byte(key)) }
	b, err := readBlob(dir, "sha256:"+image, func(h string) string { return bigData("sha256:" + h) })
	if err != nil {
		return nil, fmt.Errorf("podman's record: image configuration: %w", err)
	}
	var cfg imageConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("podman's record: image configuration: %w", err)
	}
	r := &engineRecord{Engine: "podman", ImageEnv: cfg.Config.Env, ImageLabels: cfg.Config.Labels}
	b, err = readEngineFile(filepath.Join(dir, "manifest"), 16<<20)
	if err != nil {
		return nil, fmt.Errorf("podman's record: image manifest: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("podman's record: image manifest: %w", err)
	}
	r.ImageAnnotations = m.Annotations
	return r, nil
}
