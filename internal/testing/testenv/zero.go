package testenv

import (
	"context"
	"reflect"
	"testing"
)

// ZeroValueSafe calls every exported method of each of values (pointers to
// zero values of exported types) twice, with zero arguments and with
// plausible ones ("test-1" for a string, 1 for a number, {"0"} for a list
// of strings; a background context for a context.Context), and fails tb for
// each call that panics: an exported type's zero value must be usable or
// refuse with an error, never panic. Methods named in skip ("Type.Method")
// are not called (those that block by design).
func ZeroValueSafe(tb testing.TB, values []any, skip ...string) {
	tb.Helper()
	ctxType := reflect.TypeFor[context.Context]()
	for _, v := range values {
		rv := reflect.ValueOf(v)
		rt := rv.Type()
		for i := range rt.NumMethod() {
			m := rt.Method(i)
			name := rt.Elem().Name() + "." + m.Name
			if containsString(skip, name) {
				continue
			}
			for _, plausible := range []bool{false, true} {
				args := make([]reflect.Value, m.Type.NumIn()-1)
				for j := range args {
					at := m.Type.In(j + 1)
					switch {
					case at == ctxType:
						args[j] = reflect.ValueOf(context.Background())
					case plausible:
						args[j] = plausibleValue(at)
					default:
						args[j] = reflect.Zero(at)
					}
				}
				call(tb, name, rv.Method(i), m.Type.IsVariadic(), args)
			}
		}
	}
}

// plausibleValue is a value of t that passes simple validation.
func plausibleValue(t reflect.Type) reflect.Value {
	v := reflect.New(t).Elem()
	switch t.Kind() {
	case reflect.String:
		v.SetString("test-1")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Slice:
		if t.Elem().Kind() == reflect.String {
			v = reflect.Append(v, plausibleValue(t.Elem()).Convert(t.Elem()))
			v.Index(0).SetString("0")
		}
	}
	return v
}

func call(tb testing.TB, name string, fn reflect.Value, variadic bool, args []reflect.Value) {
	tb.Helper()
	func() {
		defer func() {
			if r := recover(); r != nil {
				tb.Errorf("zero %s panics: %v", name, r)
			}
		}()
		if variadic {
			fn.CallSlice(args)
		} else {
			fn.Call(args)
		}
	}()
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
