package containerizer_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/chain"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/containerizer/rootfs"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/isolator/mps"
	"github.com/gpuiso/gpuiso/isolator/oci"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/record"
	"github.com/gpuiso/gpuiso/volume"
)

// notYetKinded are sentinels that match no kind of node's vocabulary yet;
// none is left.
var notYetKinded = map[string]bool{}

// TestVocabulary finds every exported Err* variable of the library's
// packages (examples and internal packages aside) in their sources, and
// checks that each matches exactly one of node's error kinds with
// errors.Is. A new sentinel fails the test until it is listed here, so none
// escapes the check.
func TestVocabulary(t *testing.T) {
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	sentinels := map[string]error{
		"allocator.ErrCorruptState":                 allocator.ErrCorruptState,
		"allocator.ErrClaimMismatch":                allocator.ErrClaimMismatch,
		"allocator.ErrDeviceUnavailable":            allocator.ErrDeviceUnavailable,
		"allocator.ErrDuplicateDevice":              allocator.ErrDuplicateDevice,
		"allocator.ErrInsufficient":                 allocator.ErrInsufficient,
		"allocator.ErrInvalidConstraint":            allocator.ErrInvalidConstraint,
		"allocator.ErrInvalidRequest":               allocator.ErrInvalidRequest,
		"allocator.ErrLocked":                       allocator.ErrLocked,
		"allocator.ErrNotMade":                      allocator.ErrNotMade,
		"allocator.ErrOwnerExists":                  allocator.ErrOwnerExists,
		"allocator.ErrQuotaExceeded":                allocator.ErrQuotaExceeded,
		"allocator.ErrUnknownDevice":                allocator.ErrUnknownDevice,
		"allocator.ErrUnknownMIGProfile":            allocator.ErrUnknownMIGProfile,
		"allocator.ErrUnknownOwner":                 allocator.ErrUnknownOwner,
		"allocator.ErrUnsafeLock":                   allocator.ErrUnsafeLock,
		"containerizer.ErrContainerExists":          containerizer.ErrContainerExists,
		"containerizer.ErrInvalidSpec":              containerizer.ErrInvalidSpec,
		"containerizer.ErrNoVolume":                 containerizer.ErrNoVolume,
		"containerizer.ErrNotAdopted":               containerizer.ErrNotAdopted,
		"containerizer.ErrNotMade":                  containerizer.ErrNotMade,
		"containerizer.ErrNotSupported":             containerizer.ErrNotSupported,
		"containerizer.ErrTransition":               containerizer.ErrTransition,
		"containerizer.ErrUnknownContainer":         containerizer.ErrUnknownContainer,
		"containerizer/docker.ErrDaemonUnavailable": docker.ErrDaemonUnavailable,
		"containerizer/record.ErrCorrupt":           record.ErrCorrupt,
		"containerizer/record.ErrNoRecord":          record.ErrNoRecord,
		"containerizer/record.ErrInvalidKey":        record.ErrInvalidKey,
		"containerizer/record.ErrInvalidOptions":    record.ErrInvalidOptions,
		"containerizer/record.ErrInvalidEntry":      record.ErrInvalidEntry,
		"containerizer/record.ErrNotMade":           record.ErrNotMade,
		"record.ErrCorrupt":                         record.ErrCorrupt,
		"record.ErrNoRecord":                        record.ErrNoRecord,
		"record.ErrInvalidKey":                      record.ErrInvalidKey,
		"record.ErrInvalidOptions":                  record.ErrInvalidOptions,
		"record.ErrInvalidEntry":                    record.ErrInvalidEntry,
		"record.ErrNotMade":                         record.ErrNotMade,
		"containerizer/docker.ErrNoVolume":          docker.ErrNoVolume,
		"containerizer/docker.ErrNotManaged":        docker.ErrNotManaged,
		"containerizer/rootfs.ErrFormat":            rootfs.ErrFormat,
		"containerizer/rootfs.ErrNotEmpty":          rootfs.ErrNotEmpty,
		"containerizer/rootfs.ErrLimit":             rootfs.ErrLimit,
		"containerizer/rootfs.ErrUnsafe":            rootfs.ErrUnsafe,
		"containerizer/rootfs.ErrInvalidOption":     rootfs.ErrInvalidOption,
		"containerizer/chain.ErrNotMade":            chain.ErrNotMade,
		"containerizer/chain.ErrUnknownContainer":   chain.ErrUnknownContainer,
		"containerizer/chain.ErrContainerExists":    chain.ErrContainerExists,
		"containerizer/chain.ErrInvalidCgroup":      chain.ErrInvalidCgroup,
		"containerizer/chain.ErrStillRunning":       chain.ErrStillRunning,
		"containerizer/chain.ErrInUse":              chain.ErrInUse,
		"containerizer/chain.ErrClosed":             chain.ErrClosed,
		"containerizer/chain.ErrUnsafeLock":         chain.ErrUnsafeLock,
		"containerizer/chain.ErrCorruptRecord":      chain.ErrCorruptRecord,
		"isolator.ErrInvalidRule":                   isolator.ErrInvalidRule,
		"isolator.ErrNoMIGCaps":                     isolator.ErrNoMIGCaps,
		"isolator.ErrNotSupported":                  isolator.ErrNotSupported,
		"isolator.ErrUnknownContainer":              isolator.ErrUnknownContainer,
		"isolator.ErrUnknownGPU":                    isolator.ErrUnknownGPU,
		"isolator.ErrUnknownNUMANode":               isolator.ErrUnknownNUMANode,
		"isolator/cdi.ErrInvalidKind":               cdi.ErrInvalidKind,
		"isolator/cdi.ErrInvalidSpec":               cdi.ErrInvalidSpec,
		"isolator/cdi.ErrNoDevices":                 cdi.ErrNoDevices,
		"isolator/cdi.ErrUnresolvable":              cdi.ErrUnresolvable,
		"isolator/cdi.ErrInvalidDir":                cdi.ErrInvalidDir,
		"isolator/cgroups.ErrNotMade":               cgroups.ErrNotMade,
		"isolator/cgroups.ErrVerify":                cgroups.ErrVerify,
		"isolator/dockerconfig.ErrInvalidLabels":    dockerconfig.ErrInvalidLabels,
		"isolator/dockerconfig.ErrInvalidPlan":      dockerconfig.ErrInvalidPlan,
		"isolator/docker.ErrInvalidLabels":          dockerconfig.ErrInvalidLabels, // the deprecated path's same values
		"isolator/docker.ErrInvalidPlan":            dockerconfig.ErrInvalidPlan,
		"isolator/docker.ErrNilConfig":              dockerconfig.ErrNilConfig,
		"isolator/dockerconfig.ErrNilConfig":        dockerconfig.ErrNilConfig,
		"isolator/oci.ErrNoLinux":                   oci.ErrNoLinux,
		"isolator/mps.ErrNoControl":                 mps.ErrNoControl,
		"isolator/mps.ErrNoServer":                  mps.ErrNoServer,
		"isolator/mps.ErrInvalid":                   mps.ErrInvalid,
		"isolator/mps.ErrExists":                    mps.ErrExists,
		"isolator/mps.ErrUnknownOwner":              mps.ErrUnknownOwner,
		"isolator/mps.ErrDaemon":                    mps.ErrDaemon,
		"isolator/mps.ErrTampered":                  mps.ErrTampered,
		"isolator/mps.ErrUnsafeRestart":             mps.ErrUnsafeRestart,
		"isolator/mps.ErrLocked":                    mps.ErrLocked,
		"isolator/mps.ErrNotMade":                   mps.ErrNotMade,
		"isolator/mps.ErrNoManager":                 mps.ErrNoManager,
		"isolator.ErrInvalidMPS":                    isolator.ErrInvalidMPS,
		"containerizer.ErrNoMPS":                    containerizer.ErrNoMPS,
		"allocator.ErrShareNotSupported":            allocator.ErrShareNotSupported,
		"node.ErrCorrupt":                           node.ErrCorrupt,
		"node.ErrNotMade":                           node.ErrNotMade,
		"node.ErrExists":                            node.ErrExists,
		"node.ErrInsufficient":                      node.ErrInsufficient,
		"node.ErrInvalid":                           node.ErrInvalid,
		"node.ErrInvalidBusID":                      node.ErrInvalidBusID,
		"node.ErrInvalidOwner":                      node.ErrInvalidOwner,
		"node.ErrInvalidProcess":                    node.ErrInvalidProcess,
		"node.ErrInvalidTopology":                   node.ErrInvalidTopology,
		"node.ErrNotFound":                          node.ErrNotFound,
		"node.ErrResetFailed":                       node.ErrResetFailed,
		"node.ErrNotSupported":                      node.ErrNotSupported,
		"node.ErrUnavailable":                       node.ErrUnavailable,
		"node/nvmlnode.ErrDriverNotLoaded":          nvmlnode.ErrDriverNotLoaded,
		"node/nvmlnode.ErrGPULost":                  nvmlnode.ErrGPULost,
		"node/nvmlnode.ErrLibraryNotFound":          nvmlnode.ErrLibraryNotFound,
		"node/nvmlnode.ErrNotNVML":                  nvmlnode.ErrNotNVML,
		"node/simnode.ErrHostLocked":                simnode.ErrHostLocked,
		"node/simnode.ErrHostPath":                  simnode.ErrHostPath,
		"node/simnode.ErrInvalidSpec":               simnode.ErrInvalidSpec,
		"node/simnode.ErrInvalidVersion":            simnode.ErrInvalidVersion,
		"node/simnode.ErrMIGFault":                  simnode.ErrMIGFault,
		"node/simnode.ErrMIGFull":                   simnode.ErrMIGFull,
		"node/simnode.ErrMIGLayout":                 simnode.ErrMIGLayout,
		"node/simnode.ErrNoSuchGPU":                 simnode.ErrNoSuchGPU,
		"node/simnode.ErrNoSuchMIGDevice":           simnode.ErrNoSuchMIGDevice,
		"node/simnode.ErrNotOwned":                  simnode.ErrNotOwned,
		"node/simnode.ErrRealDev":                   simnode.ErrRealDev,
		"node/simnode.ErrResetFault":                simnode.ErrResetFault,
		"node/simnode.ErrTreeExists":                simnode.ErrTreeExists,
		"node/simnode.ErrUntrusted":                 simnode.ErrUntrusted,
		"node/simnode.ErrUnknownTopology":           simnode.ErrUnknownTopology,
		"volume.ErrDamaged":                         volume.ErrDamaged,
		"volume.ErrEscapesRoot":                     volume.ErrEscapesRoot,
		"volume.ErrInvalidName":                     volume.ErrInvalidName,
		"volume.ErrInvalidRequirement":              volume.ErrInvalidRequirement,
		"volume.ErrInvalidVersion":                  volume.ErrInvalidVersion,
		"volume.ErrLocked":                          volume.ErrLocked,
		"volume.ErrNoDriver":                        volume.ErrNoDriver,
		"volume.ErrNoDriverVersion":                 volume.ErrNoDriverVersion,
		"volume.ErrNotFound":                        volume.ErrNotFound,
		"volume.ErrNotMade":                         volume.ErrNotMade,
		"volume.ErrRequirementUnmet":                volume.ErrRequirementUnmet,
		"volume.ErrUnsafe":                          volume.ErrUnsafe,
		"volume.ErrVersionMismatch":                 volume.ErrVersionMismatch,
	}
	found := exportedSentinels(t, "..")
	for _, name := range found {
		err, ok := sentinels[name]
		if !ok {
			t.Errorf("%s: a sentinel this test does not know; add it to the table", name)
			continue
		}
		n := 0
		for _, k := range kinds {
			if errors.Is(err, k) {
				n++
			}
		}
		if n != 1 && !notYetKinded[name] {
			t.Errorf("%s (%v) matches %d of node's error kinds, want exactly 1", name, err, n)
		}
	}
	if len(found) != len(sentinels) {
		t.Errorf("found %d sentinels in the sources, the table has %d", len(found), len(sentinels))
	}
}

// exportedSentinels lists "<package dir>.<name>" for every exported
// package-level variable named Err* in the non-test files under root.
func exportedSentinels(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			// Programs (cmd/, examples/) and internal packages export
			// nothing an importer reaches.
			if p != root && (d.Name() == "cmd" || d.Name() == "examples" || d.Name() == "internal" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); p != root && err == nil {
				return filepath.SkipDir // a module of its own (kubernetes/), with its own test
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, src, 0)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(p))
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if strings.HasPrefix(n.Name, "Err") {
						out = append(out, filepath.ToSlash(dir)+"."+n.Name)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
