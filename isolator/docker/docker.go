// Package docker is the old path of [dockerconfig], which applies an
// isolator.Plan to a Docker container's configuration. It was renamed so
// that a program can import it beside containerizer/docker without an
// alias.
//
// Deprecated: import github.com/gpuiso/gpuiso/isolator/dockerconfig. Every
// name here is the same value or type as there; this package will be
// removed in the next release.
package docker

import (
	"github.com/gpuiso/gpuiso/isolator"
	"github.com/gpuiso/gpuiso/isolator/dockerconfig"
	"github.com/gpuiso/gpuiso/node"
)

// The injections and labels of [dockerconfig].
const (
	InjectionDevices  = dockerconfig.InjectionDevices
	InjectionCDI      = dockerconfig.InjectionCDI
	LabelOwner        = dockerconfig.LabelOwner
	LabelGPUs         = dockerconfig.LabelGPUs
	LabelInjection    = dockerconfig.LabelInjection
	CDIDriver         = dockerconfig.CDIDriver
	CDIMinAPIVersion  = dockerconfig.CDIMinAPIVersion
	CgroupPermissions = dockerconfig.CgroupPermissions
)

// The errors of [dockerconfig], the same values.
var (
	ErrInvalidPlan   = dockerconfig.ErrInvalidPlan
	ErrInvalidLabels = dockerconfig.ErrInvalidLabels
	ErrNilConfig     = dockerconfig.ErrNilConfig
)

// Config is [dockerconfig.Config].
type Config = dockerconfig.Config

// LabelError is [dockerconfig.LabelError].
type LabelError = dockerconfig.LabelError

// New is [dockerconfig.New].
func New(plan *isolator.Plan) (*Config, error) { return dockerconfig.New(plan) }

// NewCDI is [dockerconfig.NewCDI].
func NewCDI(plan *isolator.Plan, kind string) (*Config, error) {
	return dockerconfig.NewCDI(plan, kind)
}

// ParseLabels is [dockerconfig.ParseLabels].
func ParseLabels(labels map[string]string) (owner string, gpus []node.DeviceRef, err error) {
	return dockerconfig.ParseLabels(labels)
}

// CDISupported is [dockerconfig.CDISupported].
func CDISupported(apiVersion string, cdiSpecDirs []string) bool {
	return dockerconfig.CDISupported(apiVersion, cdiSpecDirs)
}
