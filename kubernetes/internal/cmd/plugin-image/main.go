// Command plugin-image writes the image of gpuiso-kubelet-plugin as an OCI
// archive, assembled from a built program without a registry or a build
// daemon (the same content the test suites import into their nodes):
//
//	plugin-image -program PATH -ref NAME -o FILE
//
// Import it into a node's containerd with
// `ctr -n k8s.io images import FILE`; the chart's default image is the
// default NAME.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpuiso/gpuiso/kubernetes/internal/cluster"
)

func main() {
	program := flag.String("program", "", "the built gpuiso-kubelet-plugin")
	// Fully qualified, as the container runtime's CRI looks images up:
	// the chart's default image, gpuiso-kubelet-plugin:0.1.0, is this.
	ref := flag.String("ref", "docker.io/library/gpuiso-kubelet-plugin:0.1.0", "the image's name")
	out := flag.String("o", "gpuiso-kubelet-plugin.tar", "the archive to write")
	flag.Parse()
	if *program == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: plugin-image -program PATH [-ref NAME] [-o FILE]")
		os.Exit(2)
	}
	b, err := cluster.PluginImageArchive(*ref, *program)
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "plugin-image: %v\n", err)
		os.Exit(1)
	}
}
