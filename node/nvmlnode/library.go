package nvmlnode

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"github.com/gpuiso/gpuiso/node"
)

// ErrNotNVML: a file given as the NVML library is not one (not an ELF
// shared object of this machine, or one that does not export nvmlInit_v2).
var ErrNotNVML = node.Sentinel(node.ErrInvalid, "not an NVML library")

func notNVML(path, why string) error { return fmt.Errorf("%s: %s: %w", path, why, ErrNotNVML) }

// CheckLibrary tells whether path is an NVML library that can be loaded: an
// ELF shared object of this machine's class and architecture that exports
// nvmlInit_v2. Loading anything else with dlopen can crash the process (a
// file of the wrong architecture, or a program rather than a library, is
// mapped before any symbol is looked up); check first. A missing file
// matches ErrLibraryNotFound.
func CheckLibrary(path string) error {
	f, err := elf.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %w", path, ErrLibraryNotFound)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return err // could not be opened
		}
		return notNVML(path, "not an ELF file")
	}
	defer f.Close()
	if f.Type != elf.ET_DYN {
		return notNVML(path, "not a shared object (ELF type "+f.Type.String()+")")
	}
	if want := nativeMachine(); want != elf.EM_NONE && f.Machine != want {
		return notNVML(path, "built for "+f.Machine.String())
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		return notNVML(path, "no dynamic symbols")
	}
	if !slices.ContainsFunc(syms, func(s elf.Symbol) bool {
		return s.Name == "nvmlInit_v2" && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF
	}) {
		return notNVML(path, "does not export nvmlInit_v2")
	}
	return nil
}

// nativeMachine is the ELF machine of this process's own binary.
func nativeMachine() elf.Machine {
	exe, err := os.Executable()
	if err != nil {
		return elf.EM_NONE
	}
	f, err := elf.Open(exe)
	if err != nil {
		return elf.EM_NONE
	}
	defer f.Close()
	return f.Machine
}
