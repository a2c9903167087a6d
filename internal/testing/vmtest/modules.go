package vmtest

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Module is a kernel module file and the modules it depends on.
type Module struct {
	Name    string   // as insmod and depends= name it ("9pnet_virtio")
	Path    string   // the .ko file
	Depends []string // the names in its depends= field
}

// Modules finds the kernel modules under dir (a lib/modules/<version>
// tree) by name. Debian's .deb has no modules.dep (depmod makes it at
// install time), so each module's dependencies are read from its own
// .modinfo section. Compressed modules (.ko.xz, .ko.zst) are not read.
func Modules(dir string) (map[string]Module, error) {
	out := map[string]Module{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".ko") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(filepath.Base(p), ".ko")
		m := Module{Name: strings.ReplaceAll(name, "-", "_"), Path: p, Depends: modinfo(b, "depends")}
		out[m.Name] = m
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kernel modules in %s: %w", dir, err)
	}
	return out, nil
}

// modinfo returns the comma-separated values of key in a module's
// .modinfo strings ("key=value\0").
func modinfo(ko []byte, key string) []string {
	prefix := []byte("\x00" + key + "=")
	i := bytes.Index(ko, prefix)
	if i < 0 {
		return nil
	}
	rest := ko[i+len(prefix):]
	if end := bytes.IndexByte(rest, 0); end >= 0 {
		rest = rest[:end]
	}
	var out []string
	for _, f := range strings.Split(string(rest), ",") {
		if f != "" {
			out = append(out, strings.ReplaceAll(f, "-", "_"))
		}
	}
	return out
}

// LoadOrder lists the modules to load, in an order insmod accepts, so that
// want (names) load: every dependency before the modules that need it,
// each once. A name found in neither mods nor builtin (the kernel's
// modules.builtin names, which need no loading) is an error.
func LoadOrder(mods map[string]Module, builtin map[string]bool, want ...string) ([]Module, error) {
	var order []Module
	state := map[string]int{} // 1: visiting, 2: done
	var visit func(name, from string) error
	visit = func(name, from string) error {
		name = strings.ReplaceAll(name, "-", "_")
		switch state[name] {
		case 1:
			return fmt.Errorf("kernel module %s: a dependency cycle through %s", name, from)
		case 2:
			return nil
		}
		m, ok := mods[name]
		if !ok {
			if builtin[name] {
				state[name] = 2
				return nil
			}
			if from != "" {
				return fmt.Errorf("kernel module %s (needed by %s): not found", name, from)
			}
			return fmt.Errorf("kernel module %s: not found", name)
		}
		state[name] = 1
		for _, d := range m.Depends {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, m)
		return nil
	}
	for _, w := range want {
		if err := visit(w, ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// Builtin reads the names of the modules built into the kernel from dir's
// modules.builtin ("kernel/fs/ext4/ext4.ko" per line).
func Builtin(dir string) (map[string]bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "modules.builtin"))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, l := range strings.Fields(string(b)) {
		out[strings.ReplaceAll(strings.TrimSuffix(filepath.Base(l), ".ko"), "-", "_")] = true
	}
	return out, nil
}
