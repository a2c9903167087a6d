package linux

// DeviceNumber identifies a device node: its type and its major:minor pair.
type DeviceNumber struct {
	// Char is true for a character device, false for a block device.
	Char  bool
	Major uint32
	Minor uint32
}

// Filesystem magic numbers returned by [FilesystemType].
const (
	Cgroup2Magic = 0x63677270
	CgroupMagic  = 0x27e0eb
	TmpfsMagic   = 0x01021994
)

// SeccompInstruction is one instruction of a classic BPF program, as the
// kernel's struct sock_filter holds it.
type SeccompInstruction struct {
	Op uint16 `json:"op"`
	Jt uint8  `json:"jt"`
	Jf uint8  `json:"jf"`
	K  uint32 `json:"k"`
}
