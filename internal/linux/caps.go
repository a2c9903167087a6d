package linux

import (
	"fmt"
	"strings"
)

// capabilities are the kernel's capability numbers (linux/capability.h),
// by name without the CAP_ prefix.
var capabilities = map[string]int{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4,
	"KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9,
	"NET_BIND_SERVICE": 10, "NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13,
	"IPC_LOCK": 14, "IPC_OWNER": 15, "SYS_MODULE": 16, "SYS_RAWIO": 17,
	"SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20, "SYS_ADMIN": 21,
	"SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25,
	"SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29,
	"AUDIT_CONTROL": 30, "SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33,
	"SYSLOG": 34, "WAKE_ALARM": 35, "BLOCK_SUSPEND": 36, "AUDIT_READ": 37,
	"PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40,
}

// Capability returns the number of the capability called name ("SYS_ADMIN"
// or "CAP_SYS_ADMIN", any case). An unknown name gives an error matching
// [ErrUnknownCapability].
func Capability(name string) (int, error) {
	n, ok := capabilities[strings.TrimPrefix(strings.ToUpper(name), "CAP_")]
	if !ok {
		return 0, fmt.Errorf("capability %q: %w", name, ErrUnknownCapability)
	}
	return n, nil
}

// CapabilityName returns the name of capability n as "CAP_" + its name, or
// "" when n is not a known capability.
func CapabilityName(n int) string {
	for name, v := range capabilities {
		if v == n {
			return "CAP_" + name
		}
	}
	return ""
}
