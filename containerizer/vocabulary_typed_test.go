package containerizer_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/containerizer"
	"github.com/gpuiso/gpuiso/containerizer/chain"
	"github.com/gpuiso/gpuiso/containerizer/docker"
	"github.com/gpuiso/gpuiso/containerizer/rootfs"
	"github.com/gpuiso/gpuiso/internal/ldcache"
	"github.com/gpuiso/gpuiso/internal/linux"
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/cdi"
	"github.com/gpuiso/gpuiso/isolator/cgroups"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/nvmlnode"
	"github.com/gpuiso/gpuiso/node/simnode"
	"github.com/gpuiso/gpuiso/record"
	"github.com/gpuiso/gpuiso/volume"
)

// typedCase is one typed error, built as its package builds it, with the
// package sentinel and the kind of node's vocabulary it must match.
type typedCase struct {
	err      error
	sentinel error
	kind     error
}

// TestVocabularyTypedErrors finds every exported error type of the
// module's packages (those with an Error method; examples aside, internal
// packages included) in their sources, builds each, and checks that it
// matches its package's sentinel and exactly one of node's error kinds, the
// one its sentinel is of. A new error type fails the test until it is
// listed here.
func TestVocabularyTypedErrors(t *testing.T) {
	kinds := []error{node.ErrNotSupported, node.ErrInvalid, node.ErrExists, node.ErrNotFound, node.ErrInsufficient, node.ErrUnavailable, node.ErrCorrupt}
	limit := &rootfs.LimitError{Limit: "bytes", Max: 1}
	typed := map[string][]typedCase{
		"node.InvalidOwnerError":            {{&node.InvalidOwnerError{Owner: "-x", Reason: "must start with a letter or digit"}, node.ErrInvalidOwner, node.ErrInvalid}},
		"node.HealthRuleError":              {{&node.HealthRuleError{Rule: 1, Text: "xid x", Reason: "not a number"}, node.ErrInvalid, node.ErrInvalid}},
		"node.ResetError":                   {{&node.ResetError{GPU: "GPU-1", Err: errors.New("in use")}, node.ErrResetFailed, node.ErrUnavailable}},
		"node/simnode.UnknownTopologyError": {{&simnode.UnknownTopologyError{Name: "x", Known: []string{"dgx1-volta"}}, simnode.ErrUnknownTopology, node.ErrNotFound}},
		"node/simnode.HostPathError": {
			{&simnode.HostPathError{Dir: "/proc/x", Resolved: "/proc/x"}, simnode.ErrHostPath, node.ErrInvalid},
			{&simnode.HostPathError{Dir: "/dev/x", Resolved: "/dev/x"}, simnode.ErrRealDev, node.ErrInvalid},
		},
		"node/simnode.NotOwnedError":  {{&simnode.NotOwnedError{Dir: "/tmp/x", Entries: []string{"a"}}, simnode.ErrNotOwned, node.ErrExists}},
		"node/simnode.ExistsError":    {{&simnode.ExistsError{Dir: "/tmp/sim", Path: "/tmp/sim/dev"}, simnode.ErrTreeExists, node.ErrExists}},
		"node/simnode.HostLockError":  {{&simnode.HostLockError{Dir: "/tmp/sim", Err: context.DeadlineExceeded}, simnode.ErrHostLocked, node.ErrUnavailable}},
		"node/simnode.UntrustedError": {{&simnode.UntrustedError{Dir: "/tmp/sim", Path: "/tmp/sim", Reason: "owned by uid 65534"}, simnode.ErrUntrusted, node.ErrInvalid}},
		"node/nvmlnode.NVMLError": {
			{&nvmlnode.NVMLError{Op: "init", Device: -1, Return: nvml.ERROR_LIBRARY_NOT_FOUND}, nvmlnode.ErrLibraryNotFound, node.ErrNotSupported},
			{&nvmlnode.NVMLError{Op: "init", Device: -1, Return: nvml.ERROR_DRIVER_NOT_LOADED}, nvmlnode.ErrDriverNotLoaded, node.ErrUnavailable},
			{&nvmlnode.NVMLError{Op: "get uuid", Device: 0, Return: nvml.ERROR_GPU_IS_LOST}, nvmlnode.ErrGPULost, node.ErrUnavailable},
			{&nvmlnode.NVMLError{Op: "get mig mode", Device: 0, Return: nvml.ERROR_NOT_SUPPORTED}, node.ErrNotSupported, node.ErrNotSupported},
			{&nvmlnode.NVMLError{Op: "get uuid", Device: 0, Return: nvml.ERROR_UNKNOWN}, node.ErrUnavailable, node.ErrUnavailable},
		},
		"allocator.InsufficientError":   {{&allocator.InsufficientError{Requested: 2, Free: 1}, allocator.ErrInsufficient, node.ErrInsufficient}},
		"allocator.ShareError":          {{&allocator.ShareError{Share: allocator.Share{MemoryBytes: 1 << 30}}, allocator.ErrInsufficient, node.ErrInsufficient}},
		"allocator.QuotaError":          {{&allocator.QuotaError{Group: "g", Limit: 1, Used: 1, Requested: 1}, allocator.ErrQuotaExceeded, node.ErrInsufficient}},
		"allocator.StateError":          {{&allocator.StateError{File: "state.json", Err: errors.New("bad checksum")}, allocator.ErrCorruptState, node.ErrCorrupt}},
		"allocator.ClaimError":          {{&allocator.ClaimError{Owner: "c1", Held: []string{"GPU-a"}, Claimed: []string{"GPU-b"}}, allocator.ErrClaimMismatch, node.ErrExists}},
		"allocator.UnsafeLockError":     {{&allocator.UnsafeLockError{Path: "/var/lib/gpuiso/allocator/.lock", Reason: "owned by uid 1000"}, allocator.ErrUnsafeLock, node.ErrCorrupt}},
		"allocator.LockError":           {{&allocator.LockError{Dir: "/run/x", Err: context.DeadlineExceeded}, allocator.ErrLocked, node.ErrUnavailable}},
		"containerizer.TransitionError": {{&containerizer.TransitionError{ID: "c1", From: containerizer.StateExited, To: containerizer.StateRunning}, containerizer.ErrTransition, node.ErrInvalid}},
		// Its cause's kinds are hidden: a container whose GPUs are
		// another's, or whose owner has another container, is not adopted,
		// whichever kind its cause is of.
		"containerizer.NotAdoptedError": {
			{&containerizer.NotAdoptedError{ID: "c1", RuntimeID: "c1", Kind: containerizer.KindNative, Err: fmt.Errorf("gpu 0: %w", allocator.ErrDeviceUnavailable)}, containerizer.ErrNotAdopted, node.ErrInvalid},
			{&containerizer.NotAdoptedError{ID: "c1", Kind: containerizer.KindDocker, Err: &allocator.ClaimError{Owner: "c1"}}, containerizer.ErrNotAdopted, node.ErrInvalid},
			{&containerizer.NotAdoptedError{RuntimeID: "x", Kind: containerizer.KindNative, Err: &record.CorruptError{Path: "/run/x", Err: errors.New("bad checksum")}}, containerizer.ErrNotAdopted, node.ErrInvalid},
		},
		"containerizer/docker.DaemonError": {{&docker.DaemonError{Op: "inspect image", Err: errors.New("connection refused")}, docker.ErrDaemonUnavailable, node.ErrUnavailable}},
		"record.CorruptError":              {{&record.CorruptError{Path: "/run/x/c1/container.json", Err: errors.New("bad checksum")}, record.ErrCorrupt, node.ErrCorrupt}},
		"containerizer/rootfs.LimitError":  {{limit, rootfs.ErrLimit, node.ErrInvalid}},
		// A LayerError names the layer of its cause and matches what the
		// cause matches.
		"containerizer/rootfs.LayerError":  {{&rootfs.LayerError{Layer: "blobs/sha256/x", Err: limit}, rootfs.ErrLimit, node.ErrInvalid}},
		"volume.LockError":                 {{&volume.LockError{Root: "/var/run/gpuiso/volumes", Err: context.DeadlineExceeded}, volume.ErrLocked, node.ErrUnavailable}},
		"volume.UnsafeError":               {{&volume.UnsafeError{Path: "/var/run/gpuiso", Reason: "group-writable"}, volume.ErrUnsafe, node.ErrCorrupt}},
		"volume.DamagedError":              {{&volume.DamagedError{Path: "/v", Problems: []string{"lib: size"}}, volume.ErrDamaged, node.ErrCorrupt}},
		"volume.VersionError":              {{&volume.VersionError{Tried: []error{errors.New("no proc")}}, volume.ErrNoDriverVersion, node.ErrUnavailable}},
		"volume.SyntaxError":               {{&volume.SyntaxError{Expr: "cuda>>1", Token: ">>1", Reason: "bad operator"}, volume.ErrInvalidRequirement, node.ErrInvalid}},
		"volume.UnmetError":                {{&volume.UnmetError{Source: "NVIDIA_REQUIRE_CUDA", Expr: "cuda>=13.0", Driver: "535.309.01", CUDA: "12.2", GPU: -1}, volume.ErrRequirementUnmet, node.ErrNotSupported}},
		"volume.VersionMismatchError":      {{&volume.VersionMismatchError{Version: "535.1", Found: []string{"550.2"}}, volume.ErrVersionMismatch, node.ErrInvalid}},
		"isolator/dockerconfig.LabelError": {{&dockerconfig.LabelError{Label: "gpuiso.gpus", Value: "x", Reason: "not a list"}, dockerconfig.ErrInvalidLabels, node.ErrInvalid}},
		"isolator/cdi.KindError":           {{&cdi.KindError{Kind: "x", Reason: "no class"}, cdi.ErrInvalidKind, node.ErrInvalid}},
		"isolator/cdi.SpecError":           {{&cdi.SpecError{Path: "/etc/cdi/x.json", Err: errors.New("no devices")}, cdi.ErrInvalidSpec, node.ErrInvalid}},
		"isolator/cgroups.VerifyError":     {{&cgroups.VerifyError{Owner: "c1"}, cgroups.ErrVerify, node.ErrCorrupt}},
		"internal/linux.UnsafeLockError":   {{&linux.UnsafeLockError{Path: "/run/x/.lock", Reason: "a link"}, linux.ErrUnsafeLock, node.ErrCorrupt}},
		// The agent's state directory lock.
		"containerizer/chain.UnsafeLockError": {{&chain.UnsafeLockError{Path: "/var/lib/agent/.lock", Reason: "owned by uid 1000"}, chain.ErrUnsafeLock, node.ErrCorrupt}},
		"internal/ldcache.FormatError": {
			{&ldcache.FormatError{Offset: 3, Reason: "truncated"}, ldcache.ErrInvalid, node.ErrInvalid},
			{&ldcache.FormatError{Offset: 0, Reason: "old layout alone", Unsupported: true}, ldcache.ErrUnsupported, node.ErrNotSupported},
		},
	}
	found := exportedErrorTypes(t, "..")
	for _, name := range found {
		cases, ok := typed[name]
		if !ok {
			t.Errorf("%s: an error type this test does not know; add it to the table", name)
			continue
		}
		for i, c := range cases {
			wrapped := fmt.Errorf("context: %w", c.err)
			if !errors.Is(wrapped, c.sentinel) {
				t.Errorf("%s[%d] (%v) does not match its sentinel %v", name, i, c.err, c.sentinel)
			}
			var matched []string
			for _, k := range kinds {
				if errors.Is(wrapped, k) {
					matched = append(matched, k.Error())
				}
			}
			if len(matched) != 1 || !errors.Is(wrapped, c.kind) {
				t.Errorf("%s[%d] (%v) matches the kinds %q, want exactly %q", name, i, c.err, matched, c.kind.Error())
			}
			if !errors.Is(c.sentinel, c.kind) {
				t.Errorf("%s[%d]: the table's sentinel %v is not of kind %v", name, i, c.sentinel, c.kind)
			}
		}
	}
	if len(found) != len(typed) {
		t.Errorf("found %d error types in the sources, the table has %d", len(found), len(typed))
	}
}

// exportedErrorTypes lists "<package dir>.<type>" for every exported type
// with an Error method in the non-test files under root (examples,
// testdata and nested modules aside; internal packages included).
func exportedErrorTypes(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (d.Name() == "cmd" || d.Name() == "examples" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
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
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, 0)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(p))
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "Error" || len(fn.Type.Params.List) != 0 {
				continue
			}
			recv := fn.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			if id, ok := recv.(*ast.Ident); ok && id.IsExported() {
				out = append(out, filepath.ToSlash(dir)+"."+id.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestOneUnknownContainer: the packages that know containers by id share
// one ErrUnknownContainer, so one errors.Is covers each of them.
func TestOneUnknownContainer(t *testing.T) {
	if containerizer.ErrUnknownContainer != isolator.ErrUnknownContainer || chain.ErrUnknownContainer != isolator.ErrUnknownContainer {
		t.Fatal("containerizer, containerizer/chain and isolator declare different ErrUnknownContainer sentinels")
	}
}
