package volume

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

// cudaImageRequire builds an official nvidia/cuda image's NVIDIA_REQUIRE_CUDA:
// the CUDA version, then each older supported branch for every brand name
// the images list (the first branch for tesla alone when teslaOnly is set).
func cudaImageRequire(cuda string, teslaOnly string, branches ...int) string {
	brands := []string{"tesla", "unknown", "nvidia", "nvidiartx", "geforce", "geforcertx", "quadro", "quadrortx", "titan", "titanrtx"}
	parts := []string{"cuda>=" + cuda}
	if teslaOnly != "" {
		parts = append(parts, fmt.Sprintf("brand=tesla,driver>=%s,driver<%s", teslaOnly, fmt.Sprint(atoi(teslaOnly)+1)))
	}
	for _, b := range branches {
		for _, brand := range brands {
			parts = append(parts, fmt.Sprintf("brand=%s,driver>=%d,driver<%d", brand, b, b+1))
		}
	}
	return strings.Join(parts, " ")
}

func atoi(s string) int { var n int; fmt.Sscan(s, &n); return n }

func TestCheckOfficialCUDAImages(t *testing.T) {
	cuda118 := cudaImageRequire("11.8", "450", 470, 510, 515)
	cuda122 := cudaImageRequire("12.2", "", 470, 525, 535)
	if !strings.HasPrefix(cuda118, "cuda>=11.8 brand=tesla,driver>=450,driver<451 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 brand=nvidiartx") {
		t.Fatalf("11.8 requirement %q", cuda118)
	}
	drivers := map[string]Driver{
		"470": {Version: "470.223.02", CUDA: node.CUDAVersion(11040)},
		"510": {Version: "510.108.03", CUDA: node.CUDAVersion(11060)},
		"520": {Version: "520.61.05", CUDA: node.CUDAVersion(11080)},
		"525": {Version: "525.147.05", CUDA: node.CUDAVersion(12000)},
		"535": {Version: "535.309.01", CUDA: node.CUDAVersion(12020)},
	}
	// Brands as discovery names them; every one after TITAN is Unknown to
	// the runtime, and so to requirements.
	gpus := []string{"GeForce RTX", "NVIDIA RTX", "Quadro RTX", "Tesla", "", "GeForce", "NVIDIA"}
	tests := []struct {
		image, require, driver string
		refused                []string // brands refused; nil: all accepted
	}{
		{"11.8", cuda118, "470", nil},
		{"11.8", cuda118, "510", nil},
		{"11.8", cuda118, "520", nil}, // cuda 11.8 itself
		{"11.8", cuda118, "525", nil},
		{"11.8", cuda118, "535", nil},
		{"12.2", cuda122, "470", nil},
		{"12.2", cuda122, "510", gpus},
		{"12.2", cuda122, "520", gpus},
		{"12.2", cuda122, "525", nil},
		{"12.2", cuda122, "535", nil},
		// brand=geforcertx and brand=nvidiartx never match: those GPUs are
		// Unknown to the runtime.
		{"rtx names only", "cuda>=12.2 brand=geforcertx,driver>=525,driver<526 brand=nvidiartx,driver>=525,driver<526", "525", gpus},
		{"unknown only", "cuda>=12.2 brand=unknown,driver>=525,driver<526", "525", []string{"Tesla", "GeForce"}},
		{"tesla only", "cuda>=12.2 brand=TESLA,driver>=525,driver<526", "525", []string{"GeForce RTX", "NVIDIA RTX", "Quadro RTX", "", "GeForce", "NVIDIA"}},
	}
	for _, tt := range tests {
		for i, brand := range gpus {
			name := fmt.Sprintf("%s/driver %s/%q", tt.image, tt.driver, brand)
			t.Run(name, func(t *testing.T) {
				img := Image{Env: []string{"CUDA_VERSION=12.2.2", "NVIDIA_REQUIRE_CUDA=" + tt.require}}
				err := Check(img, drivers[tt.driver], []node.Device{{Index: i, ComputeCapability: "8.6", Brand: brand}})
				refused := false
				for _, b := range tt.refused {
					refused = refused || b == brand
				}
				if refused != errors.Is(err, ErrRequirementUnmet) || (!refused && err != nil) {
					t.Fatalf("Check = %v; want refused %v", err, refused)
				}
			})
		}
	}
}

func TestRequirementsForms(t *testing.T) {
	drv := Driver{Version: "525.147.05", CUDA: node.CUDAVersion(12000)}
	tests := []struct {
		name    string
		img     Image
		refused bool
	}{
		{"require cuda set but empty implies cuda_version", Image{Env: []string{"CUDA_VERSION=12.2.2", "NVIDIA_REQUIRE_CUDA="}}, true},
		{"cuda_version alone", Image{Env: []string{"CUDA_VERSION=12.0.1"}}, false},
		{"jetpack ignored", Image{Env: []string{"NVIDIA_REQUIRE_JETPACK=csv-mounts=all", "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=x"}}, false},
		{"unknown property ignored", Image{Env: []string{"NVIDIA_REQUIRE_FOO=foo=45"}}, false},
		{"empty label: no check", Image{Labels: map[string]string{LabelCUDAVersion: ""}}, false},
		{"label newer than the driver", Image{Labels: map[string]string{LabelCUDAVersion: "12.2"}}, true},
		{"disabled", Image{Env: []string{"CUDA_VERSION=12.2.2", "NVIDIA_DISABLE_REQUIRE=true"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.img, drv, nil)
			if errors.Is(err, ErrRequirementUnmet) != tt.refused || (!tt.refused && err != nil) {
				t.Fatalf("Check = %v; want refused %v", err, tt.refused)
			}
		})
	}
}

func TestBrandName(t *testing.T) {
	want := []string{"Unknown", "Quadro", "Tesla", "NVS", "GRID", "GeForce", "TITAN"}
	for b := -1; b <= 18; b++ {
		w := "Unknown"
		if b >= 0 && b < len(want) {
			w = want[b]
		}
		if got := BrandName(b); got != w {
			t.Errorf("BrandName(%d) = %q, want %q", b, got, w)
		}
	}
}
