// Package device is the Go code of Nomad's device plugin service
// (hashicorp.nomad.plugins.device.DevicePlugin), generated from
// device.proto by generate.sh: the fingerprint stream, Reserve, and the
// statistics stream.
package device
