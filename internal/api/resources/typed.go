package resources

import (
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The adapters below let a description write its hooks over its own type.

// Typed adapts a function over one concrete type to a hook.
func Typed[T runtime.Object](f func(T)) func(runtime.Object) {
	return func(o runtime.Object) { f(o.(T)) }
}

// TypedValidate adapts a validation over one concrete type.
func TypedValidate[T runtime.Object](f func(T) field.ErrorList) func(runtime.Object) field.ErrorList {
	return func(o runtime.Object) field.ErrorList { return f(o.(T)) }
}

// TypedValidateUpdate adapts an update validation over one concrete type.
func TypedValidateUpdate[T runtime.Object](f func(T, T) field.ErrorList) func(runtime.Object, runtime.Object) field.ErrorList {
	return func(o, old runtime.Object) field.ErrorList { return f(o.(T), old.(T)) }
}

// TypedFields adapts a field set over one concrete type.
func TypedFields[T runtime.Object](f func(T) fields.Set) func(runtime.Object) fields.Set {
	return func(o runtime.Object) fields.Set { return f(o.(T)) }
}

// TypedRow adapts a table row over one concrete type.
func TypedRow[T runtime.Object](f func(T) []any) func(runtime.Object) []any {
	return func(o runtime.Object) []any { return f(o.(T)) }
}

// TypedUpdate adapts an update preparation over one concrete type.
func TypedUpdate[T runtime.Object](f func(T, T)) func(runtime.Object, runtime.Object) {
	return func(o, old runtime.Object) { f(o.(T), old.(T)) }
}
