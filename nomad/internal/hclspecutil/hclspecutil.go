// Package hclspecutil turns the configuration schema of Nomad's plugin
// protocol (a tree of hclspec.Spec messages) into the HCL decoder spec it
// describes, and encodes a plugin block as Nomad does before SetConfig: the
// block's JSON form decoded with that spec, then go-cty's msgpack encoding
// of the value. The plugin reads its configuration with the first; tests,
// standing in for Nomad, write it with the second.
package hclspecutil

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hcldec"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	hcljson "github.com/hashicorp/hcl/v2/json"
	"github.com/zclconf/go-cty/cty"
	ctymsgpack "github.com/zclconf/go-cty/cty/msgpack"

	"github.com/gpuiso/gpuiso/nomad/internal/proto/hclspec"
)

// ErrSpec: a spec message cannot be turned into a decoder spec.
var ErrSpec = errors.New("invalid hcl spec")

// Decoder returns the HCL decoder spec that s describes.
func Decoder(s *hclspec.Spec) (hcldec.Spec, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: empty spec", ErrSpec)
	}
	switch b := s.GetBlock().(type) {
	case *hclspec.Spec_Object:
		obj := hcldec.ObjectSpec{}
		names := make([]string, 0, len(b.Object.GetAttributes()))
		for name := range b.Object.GetAttributes() {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			d, err := Decoder(b.Object.GetAttributes()[name])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			obj[name] = d
		}
		return obj, nil
	case *hclspec.Spec_Array:
		var arr hcldec.TupleSpec
		for i, v := range b.Array.GetValues() {
			d, err := Decoder(v)
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			arr = append(arr, d)
		}
		return arr, nil
	case *hclspec.Spec_Attr:
		ty, err := parseType(b.Attr.GetType())
		if err != nil {
			return nil, fmt.Errorf("attribute %s: %w", b.Attr.GetName(), err)
		}
		return &hcldec.AttrSpec{Name: b.Attr.GetName(), Type: ty, Required: b.Attr.GetRequired()}, nil
	case *hclspec.Spec_BlockValue:
		nested, err := Decoder(b.BlockValue.GetNested())
		if err != nil {
			return nil, fmt.Errorf("block %s: %w", b.BlockValue.GetName(), err)
		}
		return &hcldec.BlockSpec{TypeName: b.BlockValue.GetName(), Required: b.BlockValue.GetRequired(), Nested: nested}, nil
	case *hclspec.Spec_BlockAttrs:
		ty, err := parseType(b.BlockAttrs.GetType())
		if err != nil {
			return nil, fmt.Errorf("block %s: %w", b.BlockAttrs.GetName(), err)
		}
		return &hcldec.BlockAttrsSpec{TypeName: b.BlockAttrs.GetName(), ElementType: ty, Required: b.BlockAttrs.GetRequired()}, nil
	case *hclspec.Spec_BlockList:
		nested, err := Decoder(b.BlockList.GetNested())
		if err != nil {
			return nil, fmt.Errorf("block list %s: %w", b.BlockList.GetName(), err)
		}
		return &hcldec.BlockListSpec{TypeName: b.BlockList.GetName(), Nested: nested, MinItems: int(b.BlockList.GetMinItems()), MaxItems: int(b.BlockList.GetMaxItems())}, nil
	case *hclspec.Spec_BlockSet:
		nested, err := Decoder(b.BlockSet.GetNested())
		if err != nil {
			return nil, fmt.Errorf("block set %s: %w", b.BlockSet.GetName(), err)
		}
		return &hcldec.BlockSetSpec{TypeName: b.BlockSet.GetName(), Nested: nested, MinItems: int(b.BlockSet.GetMinItems()), MaxItems: int(b.BlockSet.GetMaxItems())}, nil
	case *hclspec.Spec_BlockMap:
		nested, err := Decoder(b.BlockMap.GetNested())
		if err != nil {
			return nil, fmt.Errorf("block map %s: %w", b.BlockMap.GetName(), err)
		}
		return &hcldec.BlockMapSpec{TypeName: b.BlockMap.GetName(), LabelNames: b.BlockMap.GetLabels(), Nested: nested}, nil
	case *hclspec.Spec_Default:
		primary, err := Decoder(b.Default.GetPrimary())
		if err != nil {
			return nil, fmt.Errorf("default's primary: %w", err)
		}
		def, err := Decoder(b.Default.GetDefault())
		if err != nil {
			return nil, fmt.Errorf("default's value: %w", err)
		}
		return &hcldec.DefaultSpec{Primary: primary, Default: def}, nil
	case *hclspec.Spec_Literal:
		v, err := literal(b.Literal.GetValue())
		if err != nil {
			return nil, err
		}
		return &hcldec.LiteralSpec{Value: v}, nil
	}
	return nil, fmt.Errorf("%w: no spec type set", ErrSpec)
}

// parseType reads an HCL type expression: "string", "list(string)".
func parseType(s string) (cty.Type, error) {
	expr, diags := hclsyntax.ParseExpression([]byte(s), "type", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("%w: type %q: %w", ErrSpec, s, diags)
	}
	ty, diags := typeexpr.TypeConstraint(expr)
	if diags.HasErrors() {
		return cty.NilType, fmt.Errorf("%w: type %q: %w", ErrSpec, s, diags)
	}
	return ty, nil
}

// literal evaluates an HCL expression without variables: "true", "\"1m\"",
// "[]".
func literal(s string) (cty.Value, error) {
	expr, diags := hclsyntax.ParseExpression([]byte(s), "literal", hcl.InitialPos)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("%w: literal %q: %w", ErrSpec, s, diags)
	}
	v, diags := expr.Value(nil)
	if diags.HasErrors() {
		return cty.NilVal, fmt.Errorf("%w: literal %q: %w", ErrSpec, s, diags)
	}
	return v, nil
}

// Encode encodes a plugin block's configuration as Nomad does before
// SetConfig: config (the block as the agent's configuration parser reads
// it: a map of JSON-able values) goes through JSON to an HCL body, is
// decoded with the spec s describes, and the value is written in go-cty's
// msgpack encoding. A key the spec does not have, or a value it cannot
// convert, is an error as in Nomad.
func Encode(s *hclspec.Spec, config map[string]any) ([]byte, error) {
	spec, err := Decoder(s)
	if err != nil {
		return nil, err
	}
	if config == nil {
		config = map[string]any{}
	}
	src, err := json.Marshal(config)
	if err != nil {
		return nil, err
	}
	f, diags := hcljson.Parse(src, "plugin config")
	if diags.HasErrors() {
		return nil, diags
	}
	val, diags := hcldec.Decode(f.Body, spec, &hcl.EvalContext{})
	if diags.HasErrors() {
		return nil, diags
	}
	return ctymsgpack.Marshal(val, val.Type())
}
