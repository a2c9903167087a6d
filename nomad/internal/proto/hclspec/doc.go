// Package hclspec is the Go code of the configuration schema of Nomad's
// plugin protocol (hashicorp.nomad.plugins.shared.hclspec), generated from
// hclspec.proto by generate.sh: a tree of HCL decoder specs.
package hclspec
