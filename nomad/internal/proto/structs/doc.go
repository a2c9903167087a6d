// Package structs is the Go code of the typed values of Nomad's plugin
// protocol (hashicorp.nomad.plugins.shared.structs), generated from
// structs.proto by generate.sh: attributes and statistics.
package structs
