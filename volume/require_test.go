package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node"
)

func TestParseRequirement(t *testing.T) {
	tests := []struct {
		expr string
		want [][]Condition
		err  string // part of the SyntaxError's token, "" for none
	}{
		{"cuda>=11.0", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "11.0"}}}, ""},
		{"cuda>=11.0 brand=tesla,driver>=418,driver<419", [][]Condition{
			{{PropCUDA, node.OpGreaterEqual, "11.0"}},
			{{PropBrand, node.OpEqual, "tesla"}, {PropDriver, node.OpGreaterEqual, "418"}, {PropDriver, node.OpLess, "419"}},
		}, ""},
		{"  arch!=7.0  arch<=8.6  ", [][]Condition{{{PropArch, node.OpNotEqual, "7.0"}}, {{PropArch, node.OpLessEqual, "8.6"}}}, ""},
		// Property names are case-sensitive: CUDA is unknown, so dropped.
		{"CUDA>12", [][]Condition{}, ""},
		{"", [][]Condition{}, ""},
		{"cuda", nil, "cuda"},
		{"cuda>=", nil, "cuda>="},
		{"cuda=>11", nil, "cuda=>11"},
		{"cuda>=11.0,", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "11.0"}}}, ""},
		{"cuda>=11.0,,driver>=535", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "11.0"}, {PropDriver, node.OpGreaterEqual, "535"}}}, ""},
		{"cuda>=1x", nil, "cuda>=1x"},
		{"cuda>=11..0", nil, "cuda>=11..0"},
		{"cuda>=12.", nil, "cuda>=12."},
		{"brand>=tesla", [][]Condition{{{PropBrand, node.OpGreaterEqual, "tesla"}}}, ""},
		{"brand!tesla", [][]Condition{{{PropBrand, "", "!tesla"}}}, ""},
		{"brand=tes/la", [][]Condition{{{PropBrand, node.OpEqual, "tes/la"}}}, ""},
		// An alternative with no known condition is dropped, not kept as
		// an empty one that always holds.
		{"memory>=16", [][]Condition{}, ""},
		{"cuda>=13.0 foo=bar", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "13.0"}}}, ""},
		{"cuda>=13.0 ,", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "13.0"}}}, ""},
		{"foo=45,cuda>=12.0", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "12.0"}}}, ""},
		{"foo", nil, "foo"},
		// Versions are semantic versions.
		{"cuda>=v12.0", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "v12.0"}}}, ""},
		{"cuda>=12.2.0-rc1", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "12.2.0-rc1"}}}, ""},
		{"driver>=535.104.5.1", nil, "driver>=535.104.5.1"},
		{"driver>=535.104.05", nil, "driver>=535.104.05"},
		{"cuda>=12.0abc", nil, "cuda>=12.0abc"},
		{"cuda>=12.2-rc1", nil, "cuda>=12.2-rc1"},
		{"driver>=99999999999999999999999", [][]Condition{{{PropDriver, node.OpGreaterEqual, "99999999999999999999999"}}}, ""},
		// Only a single space separates alternatives; a tab is part of
		// the value.
		{"cuda>=12.0\tbrand=tesla", nil, "cuda>=12.0\tbrand=tesla"},
		{"cuda>=12.0,\t", [][]Condition{{{PropCUDA, node.OpGreaterEqual, "12.0"}}}, ""},
		{"\tcuda>=12.0", [][]Condition{}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			r, err := ParseRequirement("NVIDIA_REQUIRE_X", tt.expr)
			if tt.want != nil {
				if err != nil || len(r.Alternatives) != len(tt.want) || len(tt.want) > 0 && !reflect.DeepEqual(r.Alternatives, tt.want) {
					t.Fatalf("ParseRequirement = %v, %v; want %v", r.Alternatives, err, tt.want)
				}
				return
			}
			var se *SyntaxError
			if !errors.As(err, &se) || !errors.Is(err, ErrInvalidRequirement) || se.Token != tt.err && tt.err != "" {
				t.Fatalf("ParseRequirement = %v, %v; want a SyntaxError at %q", r, err, tt.err)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	drv := Driver{Version: "535.309.01", CUDA: node.CUDAVersion(12020)}
	a100 := node.Device{Index: 0, ComputeCapability: "8.0", Brand: "Tesla"}
	t4 := node.Device{Index: 1, ComputeCapability: "7.5", Brand: "GeForce"}
	rtx := node.Device{Index: 2, ComputeCapability: "8.6", Brand: "NVIDIA RTX"}
	r470 := Driver{Version: "470.256.02", CUDA: node.CUDAVersion(11040)}
	tests := []struct {
		name   string
		img    Image
		drv    Driver
		gpus   []node.Device
		source string // of the unmet requirement, "" when all hold
		gpu    int
	}{
		{"no requirements", Image{}, drv, nil, "", 0},
		{"cuda met", env("NVIDIA_REQUIRE_CUDA=cuda>=12.0"), drv, nil, "", 0},
		{"cuda met exactly", env("NVIDIA_REQUIRE_CUDA=cuda>=12.2"), drv, nil, "", 0},
		{"cuda unmet", env("NVIDIA_REQUIRE_CUDA=cuda>=12.4"), drv, nil, "NVIDIA_REQUIRE_CUDA", -1},
		{"cuda unknown", env("NVIDIA_REQUIRE_CUDA=cuda>=11.0"), Driver{Version: "535.309.01"}, nil, "NVIDIA_REQUIRE_CUDA", -1},
		{"or: second alternative", env("NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=535,driver<536"), drv, []node.Device{a100}, "", 0},
		{"or: neither on a geforce", env("NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=535,driver<536"), drv, []node.Device{a100, t4}, "NVIDIA_REQUIRE_CUDA", 1},
		{"and: one fails", env("NVIDIA_REQUIRE_CUDA=cuda>=12.0,driver>=540"), drv, nil, "NVIDIA_REQUIRE_CUDA", -1},
		{"driver numeric compare", env("NVIDIA_REQUIRE_DRIVER=driver>=535.104.5,driver<535.1000"), drv, nil, "", 0},
		{"driver prefix is less", env("NVIDIA_REQUIRE_DRIVER=driver>535"), drv, nil, "", 0},
		{"arch per gpu", env("NVIDIA_REQUIRE_ARCH=arch>=8.0"), drv, []node.Device{a100, t4}, "NVIDIA_REQUIRE_ARCH", 1},
		{"arch without gpus", env("NVIDIA_REQUIRE_ARCH=arch>=9.0"), drv, nil, "", 0},
		{"brand ignores case", env("NVIDIA_REQUIRE_BRAND=brand=TESLA"), drv, []node.Device{a100}, "", 0},
		{"brand not", env("NVIDIA_REQUIRE_BRAND=brand!=geforce"), drv, []node.Device{t4}, "NVIDIA_REQUIRE_BRAND", 1},
		{"all variables must hold", env("NVIDIA_REQUIRE_A=cuda>=11", "NVIDIA_REQUIRE_B=driver>=600"), drv, nil, "NVIDIA_REQUIRE_B", -1},
		{"later entry wins", env("NVIDIA_REQUIRE_CUDA=cuda>=13", "NVIDIA_REQUIRE_CUDA=cuda>=12"), drv, nil, "", 0},
		{"disabled", env("NVIDIA_REQUIRE_CUDA=cuda>=13", "NVIDIA_DISABLE_REQUIRE=true"), drv, nil, "", 0},
		{"disable false", env("NVIDIA_REQUIRE_CUDA=cuda>=13", "NVIDIA_DISABLE_REQUIRE=false"), drv, nil, "NVIDIA_REQUIRE_CUDA", -1},
		{"legacy CUDA_VERSION met", env("CUDA_VERSION=12.2.2"), drv, nil, "", 0},
		{"legacy CUDA_VERSION unmet", env("CUDA_VERSION=12.3.0"), drv, nil, "CUDA_VERSION", -1},
		{"CUDA_VERSION ignored with NVIDIA_REQUIRE_CUDA", env("CUDA_VERSION=12.3.0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"), drv, nil, "", 0},
		{"unknown alternative dropped", env("NVIDIA_REQUIRE_CUDA=cuda>=13.0 foo=bar"), r470, nil, "NVIDIA_REQUIRE_CUDA", -1},
		{"empty alternative dropped", env("NVIDIA_REQUIRE_CUDA=cuda>=13.0 ,"), r470, nil, "NVIDIA_REQUIRE_CUDA", -1},
		{"no known condition holds", env("NVIDIA_REQUIRE_CUDA=foo=bar"), r470, nil, "", 0},
		{"upper-case property ignored", env("NVIDIA_REQUIRE_CUDA=CUDA>=13.0"), r470, nil, "", 0},
		{"leading v", env("NVIDIA_REQUIRE_CUDA=cuda>=v11.4"), r470, nil, "", 0},
		{"no cuda version: below every version", env("NVIDIA_REQUIRE_CUDA=cuda<11.0"), Driver{Version: "535.309.01"}, nil, "", 0},
		{"no cuda version: not equal", env("NVIDIA_REQUIRE_CUDA=cuda=12.2"), Driver{Version: "535.309.01"}, nil, "NVIDIA_REQUIRE_CUDA", -1},
		{"pre-release below release", env("NVIDIA_REQUIRE_CUDA=cuda>=12.2.0-rc1"), drv, nil, "", 0},
		{"newer brand reads Unknown", env("NVIDIA_REQUIRE_BRAND=brand=nvidiartx"), drv, []node.Device{rtx}, "NVIDIA_REQUIRE_BRAND", 2},
		{"brand without operator never holds", env("NVIDIA_REQUIRE_BRAND=brand!tesla"), drv, []node.Device{a100}, "NVIDIA_REQUIRE_BRAND", 0},
		{"CUDA_VERSION leading v", env("CUDA_VERSION=v12.2.2"), drv, nil, "", 0},
		{"CUDA_VERSION major only", env("CUDA_VERSION=13"), drv, nil, "CUDA_VERSION", -1},
		{"CUDA_VERSION with blank NVIDIA_REQUIRE_CUDA", env("CUDA_VERSION=13.0", "NVIDIA_REQUIRE_CUDA= "), drv, nil, "", 0},
		{"CUDA_VERSION with empty NVIDIA_REQUIRE_CUDA", env("CUDA_VERSION=13.0", "NVIDIA_REQUIRE_CUDA="), drv, nil, "CUDA_VERSION", -1},
		{"label met", Image{Labels: map[string]string{LabelCUDAVersion: "8.0"}}, drv, nil, "", 0},
		{"label unmet", Image{Labels: map[string]string{LabelCUDAVersion: "12.4"}}, drv, nil, LabelCUDAVersion, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.img, tt.drv, tt.gpus)
			if tt.source == "" {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			var ue *UnmetError
			if !errors.As(err, &ue) || !errors.Is(err, ErrRequirementUnmet) || !errors.Is(err, node.ErrNotSupported) {
				t.Fatalf("Check = %v, want an *UnmetError of kind node.ErrNotSupported", err)
			}
			if ue.Source != tt.source || ue.GPU != tt.gpu || ue.Driver != tt.drv.Version {
				t.Fatalf("unmet %+v, want source %s gpu %d", ue, tt.source, tt.gpu)
			}
			if !strings.Contains(err.Error(), tt.drv.Version) || !strings.Contains(err.Error(), ue.Expr) {
				t.Fatalf("message %q does not name the driver and the condition", err)
			}
		})
	}
	err := Check(env("NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=535,driver<535.100"), drv, []node.Device{a100})
	var ue *UnmetError
	if !errors.As(err, &ue) || fmt.Sprint(ue.Failed) != "[cuda>=12.4 driver<535.100]" {
		t.Errorf("Check = %v, want cuda>=12.4 and driver<535.100 named as false", err)
	}
	if err := Check(env("NVIDIA_REQUIRE_CUDA=cuda>>1"), drv, nil); !errors.Is(err, ErrInvalidRequirement) {
		t.Errorf("Check(bad expression) = %v, want ErrInvalidRequirement", err)
	}
	for _, bad := range []string{"x", "12.2.0.1", "12.2x", " 12.2", "4294967296.0", "12.4294967296", "12..0", "12.", "v"} {
		if err := Check(env("CUDA_VERSION="+bad), drv, nil); !errors.Is(err, ErrInvalidRequirement) {
			t.Errorf("Check(CUDA_VERSION=%q) = %v, want ErrInvalidRequirement", bad, err)
		}
	}
	for _, bad := range []string{"cuda>=12.0\tbrand=tesla", "driver>=535.104.05", "cuda>=12.2.0.1", "cuda>=13.0abc"} {
		if err := Check(env("NVIDIA_REQUIRE_CUDA="+bad), drv, nil); !errors.Is(err, ErrInvalidRequirement) {
			t.Errorf("Check(NVIDIA_REQUIRE_CUDA=%q) = %v, want ErrInvalidRequirement", bad, err)
		}
	}
}

func env(kv ...string) Image { return Image{Env: kv} }

func TestUnmetErrorMessage(t *testing.T) {
	err := Check(env("NVIDIA_REQUIRE_CUDA=cuda>=12.4"), Driver{Version: "535.309.01", CUDA: 12020}, nil)
	want := `NVIDIA_REQUIRE_CUDA "cuda>=12.4" unmet by driver 535.309.01 (cuda 12.2): cuda>=12.4 false`
	if err == nil || err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
}

var requirementSeeds = map[string]string{
	"cuda":         "cuda>=11.0",
	"or-and":       "cuda>=11.0 brand=tesla,driver>=418,driver<419",
	"all-ops":      "arch=8.0,arch!=7.0 arch<9 arch<=9.0 driver>1 driver>=1",
	"empty-cond":   "cuda>=11,,driver>1",
	"no-op":        "cuda",
	"bad-op":       "cuda=>11",
	"brand-order":  "brand<tesla",
	"long":         "driver>=" + strings.Repeat("9", 70),
	"tabs":         "\tcuda>=12\n",
	"unknown-prop": "memory>=16GiB",
	"unknown-alt":  "cuda>=13.0 foo=bar",
	"empty-alt":    "cuda>=13.0 ,",
	"tab-sep":      "cuda>=12.0\tbrand=tesla",
	"semver":       "cuda>=v12.2.0-rc1 driver>=535.104.5",
}

// TestWriteRequirementCorpus keeps the checked-in seed corpus in step with
// requirementSeeds (go test -run WriteRequirementCorpus -update-corpus).
func TestWriteRequirementCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzParseRequirement")
	for name, s := range requirementSeeds {
		want := fmt.Sprintf("go test fuzz v1\nstring(%q)\n", s)
		p := filepath.Join(dir, name)
		if os.Getenv("GPUISO_UPDATE_CORPUS") != "" {
			must(t, os.WriteFile(p, []byte(want), 0o644))
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != want {
			t.Errorf("seed %s: %q, %v; want %q (GPUISO_UPDATE_CORPUS=1 rewrites it)", p, got, err, want)
		}
	}
}

func FuzzParseRequirement(f *testing.F) {
	f.Add("cuda>=12.2 brand=tesla,driver>=535")
	f.Fuzz(func(t *testing.T, expr string) {
		r, err := ParseRequirement("NVIDIA_REQUIRE_F", expr)
		if err != nil {
			if !errors.Is(err, ErrInvalidRequirement) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// What parses prints back to an expression that parses the same.
		var alts []string
		for _, a := range r.Alternatives {
			var conds []string
			for _, c := range a {
				conds = append(conds, c.String())
			}
			alts = append(alts, strings.Join(conds, ","))
		}
		again, err := ParseRequirement("NVIDIA_REQUIRE_F", strings.Join(alts, " "))
		if err != nil || !reflect.DeepEqual(again.Alternatives, r.Alternatives) {
			t.Fatalf("re-parse of %q: %v, %v", expr, again.Alternatives, err)
		}
		drv := Driver{Version: "535.309.01", CUDA: 12020}
		Check(Image{Env: []string{"NVIDIA_REQUIRE_F=" + expr}}, drv, []node.Device{{ComputeCapability: "8.0", Brand: "Tesla"}})
	})
}
