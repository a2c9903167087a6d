package containerizer_test

import (
	"testing"

	"github.com/gpuiso/gpuiso/containerizer"
)

func TestWantsVolume(t *testing.T) {
	labelled := map[string]string{"com.nvidia.volumes.needed": "nvidia_driver"}
	for _, tc := range []struct {
		name string
		img  containerizer.Image
		env  []string
		want bool
	}{
		{"host file system", containerizer.Image{Labels: labelled}, []string{"NVIDIA_VISIBLE_DEVICES=all"}, false},
		{"own root, no request", containerizer.Image{OwnRoot: true}, nil, false},
		{"own root, visible devices", containerizer.Image{OwnRoot: true}, []string{"NVIDIA_VISIBLE_DEVICES=all"}, true},
		{"own root, image visible devices", containerizer.Image{OwnRoot: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, nil, true},
		{"own root, spec voids it", containerizer.Image{OwnRoot: true, Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}, []string{"NVIDIA_VISIBLE_DEVICES=void"}, false},
		{"own root, label", containerizer.Image{OwnRoot: true, Labels: labelled}, nil, true},
	} {
		if got := tc.img.WantsVolume(tc.env); got != tc.want {
			t.Errorf("%s: WantsVolume = %v, want %v", tc.name, got, tc.want)
		}
	}
}
