package volume

import "strings"

// requirementBrands are the brand names NVIDIA's container runtime gives
// images to compare with, indexed by NVML's brand enum (nvmlBrandType_t:
// 1 Quadro, 2 Tesla, 3 NVS, 4 GRID, 5 GeForce, 6 TITAN).
var requirementBrands = [...]string{1: "Quadro", 2: "Tesla", 3: "NVS", 4: "GRID", 5: "GeForce", 6: "TITAN"}

// BrandName returns the name a brand=... requirement compares with for
// NVML's brand enum value b, as NVIDIA's container runtime reads it:
// Quadro, Tesla, NVS, GRID, GeForce and TITAN; every other value (0, and
// the newer 7 and above: NVIDIA RTX, NVIDIA, GeForce RTX, ...) is Unknown.
func BrandName(b int) string {
	if b > 0 && b < len(requirementBrands) {
		return requirementBrands[b]
	}
	return "Unknown"
}

// requirementBrand maps a GPU's brand as discovery names it ("GeForce RTX",
// "Titan", "NVIDIA") to the name requirements compare with.
func requirementBrand(brand string) string {
	for _, n := range requirementBrands[1:] {
		if strings.EqualFold(n, brand) {
			return n
		}
	}
	return "Unknown"
}
