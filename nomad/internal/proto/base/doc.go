// Package base is the Go code of Nomad's base plugin service
// (hashicorp.nomad.plugins.base.proto.BasePlugin), generated from
// base.proto by generate.sh: what a plugin is, its configuration schema,
// and its configuration.
package base
