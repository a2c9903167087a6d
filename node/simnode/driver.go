package simnode

import (
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultLibraryDirs returns where distributions install libnvidia-ml.so.1.
func DefaultLibraryDirs() []string {
	return []string{
		"/usr/lib/x86_64-linux-gnu",
		"/lib/x86_64-linux-gnu",
		"/usr/lib/aarch64-linux-gnu",
		"/usr/lib/powerpc64le-linux-gnu",
		"/usr/lib64",
		"/usr/lib",
	}
}

// FallbackDriverVersion is the simulated driver version on hosts without the
// NVIDIA user-space driver.
const FallbackDriverVersion = "550.127.05"

// HostDriverVersion returns the version of the NVIDIA user-space driver
// installed on the host: the suffix of the file libnvidia-ml.so.1 resolves
// to (libnvidia-ml.so.535.309.01) in the first of dirs that has it.
func HostDriverVersion(dirs ...string) (string, bool) {
	for _, dir := range dirs {
		real, err := filepath.EvalSymlinks(filepath.Join(dir, "libnvidia-ml.so.1"))
		if err != nil {
			continue
		}
		v, ok := strings.CutPrefix(filepath.Base(real), "libnvidia-ml.so.")
		if ok && validVersion(v) && strings.Contains(v, ".") {
			return v, true
		}
	}
	return "", false
}

// validVersion reports whether v is dot-separated decimal numbers.
func validVersion(v string) bool {
	if v == "" || len(v) > 32 {
		return false
	}
	for _, part := range strings.Split(v, ".") {
		if _, err := strconv.ParseUint(part, 10, 32); err != nil {
			return false
		}
	}
	return true
}

// cudaVersionOf is the CUDA version a driver branch supports, in NVML's
// encoding: the newest branch at or below the driver's major version.
func cudaVersionOf(driver string) int {
	major, _ := strconv.Atoi(strings.Split(driver, ".")[0])
	branches := []struct{ major, cuda int }{
		{580, 13000}, {575, 12090}, {570, 12080}, {565, 12070}, {560, 12060}, {555, 12050},
		{550, 12040}, {545, 12030}, {535, 12020}, {530, 12010}, {525, 12000}, {520, 11080},
		{515, 11070}, {510, 11060}, {495, 11050}, {470, 11040}, {465, 11030}, {460, 11020},
		{455, 11010}, {450, 11000}, {440, 10020}, {418, 10010}, {410, 10000},
	}
	for _, b := range branches {
		if major >= b.major {
			return b.cuda
		}
	}
	return 9000
}
