package node

import (
	"fmt"
	"strconv"
	"strings"
)

// NormalizeBusID returns a PCI address in the form "0000:xx:yy.z", lower
// case. It accepts NVML's 8-digit domains ("00000000:06:00.0"), upper case,
// and addresses without a domain ("06:00.0", domain 0).
func NormalizeBusID(s string) (string, error) {
	bad := func(why string) error { return fmt.Errorf("%q: %s: %w", s, why, ErrInvalidBusID) }
	parts := strings.Split(strings.TrimSpace(s), ":")
	var domain uint64
	switch len(parts) {
	case 2:
	case 3:
		d, err := strconv.ParseUint(parts[0], 16, 32)
		if err != nil || len(parts[0]) == 0 || len(parts[0]) > 8 {
			return "", bad("domain is not 1 to 8 hex digits")
		}
		domain = d
		parts = parts[1:]
	default:
		return "", bad("want [domain:]bus:device.function")
	}
	devfn := strings.Split(parts[1], ".")
	if len(devfn) != 2 {
		return "", bad("want device.function")
	}
	bus, err1 := parseHex(parts[0], 2)
	dev, err2 := parseHex(devfn[0], 2)
	fn, err3 := parseHex(devfn[1], 1)
	if err1 != nil || err2 != nil || err3 != nil || dev > 0x1f || fn > 7 {
		return "", bad("bus, device or function out of range")
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn), nil
}

func parseHex(s string, maxDigits int) (uint64, error) {
	if len(s) == 0 || len(s) > maxDigits {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseUint(s, 16, 8)
}
