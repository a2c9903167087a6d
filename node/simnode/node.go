package simnode

import (
	"crypto/sha256"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// Node is a simulated GPU node: an NVML implementation answering as the
// node's driver would, plus the controls a test needs (lose a GPU, inject an
// XID). It is safe for concurrent use.
type Node struct {
	spec          *Spec
	driverVersion string
	cudaVersion   int

	lib     *mock.Interface
	devices []*mock.Device

	mu      sync.Mutex
	faults  []gpuFaults
	sets    []*eventSet
	inited  int
	procs   [][]nvml.ProcessInfo
	mig     []migState
	samples [][]nvml.ProcessUtilizationSample

	// With ShareFaults: the host tree and its faults file, the file as
	// last read and the last event delivered from it.
	faultHost  *Host
	faultFile  *record.File[savedFaults]
	faultStamp fileStamp
	seenSeq    uint64
}

// Option configures New.
type Option func(*options) error

type options struct {
	driverVersion string
	cudaVersion   int
	libraryDirs   []string
}

// WithDriverVersion sets the simulated driver version (digits and dots).
func WithDriverVersion(v string) Option {
	return func(o *options) error {
		if !validVersion(v) {
			return fmt.Errorf("%q: %w", v, ErrInvalidVersion)
		}
		o.driverVersion = v
		return nil
	}
}

// WithCUDAVersion sets the simulated CUDA driver version in NVML's encoding
// (12020 is 12.2). By default it follows the driver version's branch.
func WithCUDAVersion(v int) Option {
	return func(o *options) error {
		if v < 1000 {
			return fmt.Errorf("CUDA version %d: want 1000*major + 10*minor", v)
		}
		o.cudaVersion = v
		return nil
	}
}

// WithLibraryDirs sets where the host's NVIDIA user-space driver is looked
// for when no driver version is given (default: the distributions' library
// directories).
func WithLibraryDirs(dirs ...string) Option {
	return func(o *options) error {
		o.libraryDirs = slices.Clone(dirs)
		return nil
	}
}

// New builds the simulated node of a shipped topology (see Names).
func New(name string, opts ...Option) (*Node, error) {
	spec, err := Load(name)
	if err != nil {
		return nil, err
	}
	return NewFromSpec(spec, opts...)
}

// NewFromSpec builds a simulated node from a topology description; a nil
// spec is refused with ErrInvalidSpec.
func NewFromSpec(spec *Spec, opts ...Option) (*Node, error) {
	if spec == nil {
		return nil, fmt.Errorf("no topology description: %w", ErrInvalidSpec)
	}
	if err := spec.validate(); err != nil {
		return nil, fmt.Errorf("topology %q: %w", spec.Name, err)
	}
	o := options{libraryDirs: DefaultLibraryDirs()}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("simulated node %s: nil option: %w", spec.Name, node.ErrInvalid)
		}
		if err := opt(&o); err != nil {
			return nil, fmt.Errorf("simulated node %s: %w", spec.Name, err)
		}
	}
	if o.driverVersion == "" {
		o.driverVersion = FallbackDriverVersion
		if v, ok := HostDriverVersion(o.libraryDirs...); ok {
			o.driverVersion = v
		}
	}
	if o.cudaVersion == 0 {
		o.cudaVersion = cudaVersionOf(o.driverVersion)
	}
	n := &Node{
		spec:          spec.clone(),
		driverVersion: o.driverVersion,
		cudaVersion:   o.cudaVersion,
		faults:        make([]gpuFaults, len(spec.GPUs)),
		procs:         make([][]nvml.ProcessInfo, len(spec.GPUs)),
		samples:       make([][]nvml.ProcessUtilizationSample, len(spec.GPUs)),
		mig:           make([]migState, len(spec.GPUs)),
	}
	for i := range n.spec.GPUs {
		n.devices = append(n.devices, n.newDevice(i))
	}
	for i := range n.spec.GPUs {
		if err := n.initMIG(i); err != nil {
			return nil, fmt.Errorf("simulated node %s: %w", spec.Name, err)
		}
	}
	n.lib = n.newInterface()
	return n, nil
}

// NVML returns the node's NVML implementation, to hand to
// nvmlnode.WithNVML and to anything else that talks to NVML.
func (n *Node) NVML() nvml.Interface { return n.lib }

// Spec returns a copy of the node's topology description.
func (n *Node) Spec() *Spec { return n.spec.clone() }

// Name is the topology's name.
func (n *Node) Name() string { return n.spec.Name }

// Len is the number of GPUs.
func (n *Node) Len() int { return len(n.spec.GPUs) }

// DriverVersion is the simulated driver's version.
func (n *Node) DriverVersion() string { return n.driverVersion }

// CUDAVersion is the simulated driver's CUDA version in NVML's encoding.
func (n *Node) CUDAVersion() int { return n.cudaVersion }

// UUID is the stable UUID of GPU i: the same for the same topology and index
// in every run.
func (n *Node) UUID(i int) string {
	sum := sha256.Sum256([]byte(n.spec.Name + "/" + fmt.Sprint(i)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// Minor is the device minor number of GPU i.
func (n *Node) Minor(i int) int { return n.spec.minor(i) }

// Lose makes GPU i fall off the bus: every NVML call about it returns
// ERROR_GPU_IS_LOST from now on, and event sets watching it receive XID 79.
// With ShareFaults, in the host tree.
func (n *Node) Lose(i int) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("lose GPU %d of %d: %w", i, n.Len(), ErrNoSuchGPU)
	}
	return n.inject(i, node.Signal{Kind: node.SignalLost}, invalidInstance, invalidInstance)
}

// Restore brings a lost GPU back (as after a reset); its other faults
// stay (Clear clears them all).
func (n *Node) Restore(i int) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("restore GPU %d of %d: %w", i, n.Len(), ErrNoSuchGPU)
	}
	if err := n.changeFaults(i, func(f *gpuFaults) { f.Lost = false }); err != nil {
		return fmt.Errorf("restore GPU %d: %w", i, err)
	}
	return nil
}

// XIDFallenOffBus is the XID a GPU reports when it falls off the bus.
const XIDFallenOffBus = 79

// InjectXID delivers an XID critical-error event for GPU i to every event
// set registered for XID events on it (with ShareFaults, through the host
// tree); unlike Inject, it leaves the driver's recovery action as it is.
func (n *Node) InjectXID(i int, xid uint64) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("inject XID %d into GPU %d of %d: %w", xid, i, n.Len(), ErrNoSuchGPU)
	}
	if err := n.changeFaults(i, func(*gpuFaults) {}, faultEvent{GI: invalidInstance, CI: invalidInstance, Type: nvml.EventTypeXidCriticalError, Data: xid}); err != nil {
		return fmt.Errorf("inject XID %d into GPU %d: %w", xid, i, err)
	}
	return nil
}

func (n *Node) isLost(i int) bool { return n.faultsOf(i).Lost }

func (n *Node) newInterface() *mock.Interface {
	lib := &mock.Interface{
		InitFunc:          n.init,
		InitWithFlagsFunc: func(uint32) nvml.Return { return n.init() },
		ShutdownFunc:      n.shutdown,
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			return n.driverVersion, nvml.SUCCESS
		},
		SystemGetCudaDriverVersionFunc:    func() (int, nvml.Return) { return n.cudaVersion, nvml.SUCCESS },
		SystemGetCudaDriverVersion_v2Func: func() (int, nvml.Return) { return n.cudaVersion, nvml.SUCCESS },
		SystemGetNVMLVersionFunc:          func() (string, nvml.Return) { return "12." + n.driverVersion, nvml.SUCCESS },
		DeviceGetCountFunc:                func() (int, nvml.Return) { return n.Len(), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= n.Len() {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return n.devices[i], nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			for i := range n.devices {
				if n.UUID(i) == uuid {
					return n.devices[i], nvml.SUCCESS
				}
			}
			if h, ok := n.migHandle(uuid); ok {
				return h, nvml.SUCCESS
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		DeviceGetHandleByPciBusIdFunc: func(busID string) (nvml.Device, nvml.Return) {
			for i, g := range n.spec.GPUs {
				if strings.EqualFold(g.BusID, busID) || strings.EqualFold("0000"+g.BusID, busID) {
					return n.devices[i], nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return n.newEventSet(), nvml.SUCCESS },
		ErrorStringFunc:    func(r nvml.Return) string { return r.Error() },
	}
	fillNotSupported(lib)
	return lib
}

func (n *Node) init() nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.inited++
	return nvml.SUCCESS
}

func (n *Node) shutdown() nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.inited == 0 {
		return nvml.ERROR_UNINITIALIZED
	}
	n.inited--
	return nvml.SUCCESS
}

// fillNotSupported sets every function field of a go-nvml mock that is still
// nil to one answering ERROR_NOT_SUPPORTED (zero values for the rest), as a
// driver without the feature would, instead of the mock's panic.
func fillNotSupported(m any) {
	v := reflect.ValueOf(m).Elem()
	retType := reflect.TypeFor[nvml.Return]()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Func || !f.IsNil() || !f.CanSet() {
			continue
		}
		ft := f.Type()
		f.Set(reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
			out := make([]reflect.Value, ft.NumOut())
			for k := range out {
				out[k] = reflect.Zero(ft.Out(k))
				if ft.Out(k) == retType {
					out[k] = reflect.ValueOf(nvml.ERROR_NOT_SUPPORTED)
				}
			}
			return out
		}))
	}
}

// guardLost wraps every function field of a device mock so that it answers
// ERROR_GPU_IS_LOST while the GPU is lost.
func guardLost(d *mock.Device, lost func() bool) {
	v := reflect.ValueOf(d).Elem()
	retType := reflect.TypeFor[nvml.Return]()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Func || f.IsNil() || !f.CanSet() {
			continue
		}
		ft, inner := f.Type(), reflect.ValueOf(f.Interface())
		f.Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
			if !lost() {
				return inner.Call(args)
			}
			out := make([]reflect.Value, ft.NumOut())
			for k := range out {
				out[k] = reflect.Zero(ft.Out(k))
				if ft.Out(k) == retType {
					out[k] = reflect.ValueOf(nvml.ERROR_GPU_IS_LOST)
				}
			}
			return out
		}))
	}
}

// SetProcesses sets the compute processes NVML lists on GPU i (and their
// memory), as a driver would for programs using it.
func (n *Node) SetProcesses(i int, procs ...nvml.ProcessInfo) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("set processes of GPU %d of %d: %w", i, n.Len(), ErrNoSuchGPU)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.procs[i] = slices.Clone(procs)
	return nil
}

// SetProcessUtilization sets the per-process utilisation samples NVML
// reports for GPU i.
func (n *Node) SetProcessUtilization(i int, samples ...nvml.ProcessUtilizationSample) error {
	if i < 0 || i >= n.Len() {
		return fmt.Errorf("set utilisation of GPU %d of %d: %w", i, n.Len(), ErrNoSuchGPU)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.samples[i] = slices.Clone(samples)
	return nil
}

func (n *Node) processes(i int) []nvml.ProcessInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.procs[i])
}

func (n *Node) utilization(i int) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.samples[i]) == 0 {
		return nil, nvml.ERROR_NOT_FOUND // no samples since the last query
	}
	return slices.Clone(n.samples[i]), nvml.SUCCESS
}
