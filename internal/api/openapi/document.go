// Package openapi publishes the OpenAPI documents Kubernetes clients read:
// v3 at /openapi/v3 and v2 at /openapi/v2 (Helm 3 and older tools). kubectl
// learns from them that the server validates fields itself (the
// fieldValidation parameter of each PATCH operation), and builds strategic
// merge patches for `apply` and `edit` from their schemas; `kubectl
// explain` prints them.
//
// The schemas are reflected from the k8s.io/api Go types: field names, types,
// formats, required fields and patch strategies come from struct tags, and
// descriptions from the SwaggerDoc methods generated from Kubernetes'
// source comments.
package openapi

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"unicode"

	"github.com/orch-dev/orch/internal/api/resources"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/utils/ptr"
)

// Document builds the OpenAPI v3 document of one group/version from the
// resources served in it.
func Document(gv schema.GroupVersion, served []*resources.Resource) *spec3.OpenAPI {
	b := &builder{gv: gv, schemas: schemas{}, paths: map[string]*spec3.Path{}}
	for _, r := range served {
		if r.GroupVersion() == gv {
			b.resource(r)
		}
	}
	b.schemas.tagKind(reflect.TypeFor[metav1.Status](), schema.GroupVersionKind{Version: "v1", Kind: "Status"})
	b.schemas.tagKind(reflect.TypeFor[metav1.DeleteOptions](), gv.WithKind("DeleteOptions"))
	b.schemas.tagKind(reflect.TypeFor[metav1.WatchEvent](), gv.WithKind("WatchEvent"))
	return &spec3.OpenAPI{
		Version:    "3.0.0",
		Info:       &spec.Info{InfoProps: spec.InfoProps{Title: "Kubernetes", Version: "unversioned"}},
		Paths:      &spec3.Paths{Paths: b.paths},
		Components: &spec3.Components{Schemas: b.schemas, SecuritySchemes: bearerToken()},
		SecurityRequirement: []map[string][]string{
			{"BearerToken": {}},
		},
	}
}

// GroupVersions lists the group/versions served, in a stable order.
func GroupVersions(served []*resources.Resource) []schema.GroupVersion {
	seen := map[schema.GroupVersion]bool{}
	var out []schema.GroupVersion
	for _, r := range served {
		if gv := r.GroupVersion(); !seen[gv] {
			seen[gv] = true
			out = append(out, gv)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// PathOf is where a group/version's document sits under /openapi/v3/.
func PathOf(gv schema.GroupVersion) string {
	if gv.Group == "" {
		return "api/" + gv.Version
	}
	return "apis/" + gv.Group + "/" + gv.Version
}

type builder struct {
	gv      schema.GroupVersion
	schemas schemas
	paths   map[string]*spec3.Path
}

// resource adds the paths and operations Kubernetes serves for r.
func (b *builder) resource(r *resources.Resource) {
	kind := r.GroupVersionKind
	var obj, list spec.Schema
	if r.OpenAPISchema != nil {
		obj, list = b.customSchemas(r)
	} else {
		b.schemas.tagKind(reflect.TypeOf(r.New()), kind)
		obj = b.schemas.ref(reflect.TypeOf(r.New()))
	}

	prefix := "/" + PathOf(b.gv)
	collection := prefix + "/" + r.Plural
	scope := ""
	params := []*spec3.Parameter{}
	if r.Namespaced {
		collection = prefix + "/namespaces/{namespace}/" + r.Plural
		scope = "Namespaced"
		params = append(params, pathParam("namespace", "object name and auth scope, such as for teams and projects"))
	}
	id := func(verb, suffix string) string { return verb + b.idGroup() + scope + kind.Kind + suffix }
	create := b.op(id("create", ""), "post", kind, writeQuery(), body(obj, writeMedia...), responses(200, obj, 201, obj, 202, obj))
	if r.Review != nil {
		// A question answered, not stored: POST to the collection only.
		b.path(collection, params).Post = create
		return
	}
	if r.OpenAPISchema == nil {
		listKind := r.GroupVersion().WithKind(kind.Kind + "List")
		b.schemas.tagKind(reflect.TypeOf(r.NewList()), listKind)
		list = b.schemas.ref(reflect.TypeOf(r.NewList()))
	}
	status := b.schemas.ref(reflect.TypeFor[metav1.Status]())
	item := collection + "/{name}"
	itemParams := append(append([]*spec3.Parameter{}, params...), pathParam("name", "name of the "+kind.Kind))

	b.path(collection, params).Get = b.op(id("list", ""), "list", kind, listQuery(), nil, responses(200, list))
	if r.Live != nil {
		// Computed when read: get and list only.
		b.path(item, itemParams).Get = b.op(id("read", ""), "get", kind, nil, nil, responses(200, obj))
		if r.Namespaced {
			b.path(prefix+"/"+r.Plural, nil).Get = b.op(b.idVerb("list")+kind.Kind+"ForAllNamespaces", "list", kind, listQuery(), nil, responses(200, list))
		}
		return
	}
	b.path(collection, params).Post = create
	b.path(collection, params).Delete = b.op(id("deletecollection", ""), "deletecollection", kind,
		append(listQuery(), deleteQuery()...), b.deleteBody(), responses(200, status))
	b.path(item, itemParams).Get = b.op(id("read", ""), "get", kind, nil, nil, responses(200, obj))
	b.path(item, itemParams).Put = b.op(id("replace", ""), "put", kind, writeQuery(), body(obj, writeMedia...), responses(200, obj, 201, obj))
	b.path(item, itemParams).Patch = b.op(id("patch", ""), "patch", kind, patchQuery(), b.patchBody(r.Custom), responses(200, obj, 201, obj))
	b.path(item, itemParams).Delete = b.op(id("delete", ""), "delete", kind, deleteQuery(), b.deleteBody(), responses(200, obj, 202, obj))
	if r.Namespaced {
		b.path(prefix+"/"+r.Plural, nil).Get = b.op(b.idVerb("list")+kind.Kind+"ForAllNamespaces", "list", kind, listQuery(), nil, responses(200, list))
	}

	for _, sub := range r.Subresources {
		path := item + "/" + sub.Name
		suffix := pascal(sub.Name)
		subKind, subObj := kind, obj
		switch sub.Serve {
		case resources.ServeLog:
			b.path(path, itemParams).Get = b.op(id("read", suffix), "get", kind, logQuery(), nil, responses(200, stringSchema()))
			continue
		case resources.ServeStream:
			// Connect operations: the request upgrades to a stream.
			b.path(path, itemParams).Get = b.op(id("connectGet", suffix), "connect", kind, nil, nil, responses(200, stringSchema()))
			b.path(path, itemParams).Post = b.op(id("connectPost", suffix), "connect", kind, nil, nil, responses(200, stringSchema()))
			continue
		case resources.ServeAction, resources.ServeAnswer:
			if !sub.Kind.Empty() {
				t := reflect.TypeOf(sub.NewBody()).Elem()
				subKind = sub.Kind
				b.schemas.tagKind(t, subKind)
				subObj = b.schemas.ref(t)
			}
			if slices.Contains(sub.Verbs, "create") {
				b.path(path, itemParams).Post = b.op(id("create", suffix), "post", subKind, writeQuery(), body(subObj, writeMedia...),
					responses(200, subObj, 201, subObj, 202, subObj))
			}
			if slices.Contains(sub.Verbs, "update") {
				b.path(path, itemParams).Put = b.op(id("replace", suffix), "put", subKind, writeQuery(), body(subObj, writeMedia...), responses(200, subObj, 201, subObj))
			}
			continue
		case resources.ServeScale:
			subKind = sub.Kind
			b.schemas.tagKind(reflect.TypeFor[autoscalingv1.Scale](), subKind)
			subObj = b.schemas.ref(reflect.TypeFor[autoscalingv1.Scale]())
		}
		b.path(path, itemParams).Get = b.op(id("read", suffix), "get", subKind, nil, nil, responses(200, subObj))
		b.path(path, itemParams).Put = b.op(id("replace", suffix), "put", subKind, writeQuery(), body(subObj, writeMedia...), responses(200, subObj, 201, subObj))
		b.path(path, itemParams).Patch = b.op(id("patch", suffix), "patch", subKind, patchQuery(), b.patchBody(r.Custom), responses(200, subObj, 201, subObj))
	}
}

// customSchemas adds a custom resource's schema, from its definition, and
// its list's, named as Kubernetes names them ("com.example.v1.Widget"),
// with metadata as the ObjectMeta every object has.
func (b *builder) customSchemas(r *resources.Resource) (obj, list spec.Schema) {
	kind := r.GroupVersionKind
	name := customName(r)
	ref := func(n string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{AllOf: []spec.Schema{*spec.RefSchema("#/components/schemas/" + n)}}}
	}
	str := func(doc string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"string"}, Description: doc}}
	}
	docs := metav1.TypeMeta{}.SwaggerDoc()
	s := *r.OpenAPISchema
	s.Properties = map[string]spec.Schema{}
	for k, v := range r.OpenAPISchema.Properties {
		s.Properties[k] = v
	}
	s.Properties["apiVersion"], s.Properties["kind"] = str(docs["apiVersion"]), str(docs["kind"])
	s.Properties["metadata"] = b.schemas.ref(reflect.TypeFor[metav1.ObjectMeta]())
	s.Properties["metadata"] = withDescription(s.Properties["metadata"], metadataDoc)
	b.schemas[name] = &s
	l := &spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"object"}, Required: []string{"items"},
		Description: "List of " + strings.ToLower(kind.Kind) + "s.",
		Properties: map[string]spec.Schema{
			"apiVersion": str(docs["apiVersion"]), "kind": str(docs["kind"]),
			"metadata": withDescription(b.schemas.ref(reflect.TypeFor[metav1.ListMeta]()), listMetadataDoc),
			"items":    {SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"array"}, Items: &spec.SchemaOrArray{Schema: ptr.To(ref(name))}}},
		}}}
	l.AddExtension("x-kubernetes-group-version-kind", []any{map[string]any{"group": kind.Group, "version": kind.Version, "kind": kind.Kind + "List"}})
	b.schemas[name+"List"] = l
	return ref(name), ref(name + "List")
}

// customName is a custom resource's schema's name, as Kubernetes names it
// ("com.example.v1.Widget").
func customName(r *resources.Resource) string {
	labels := strings.Split(r.Group, ".")
	slices.Reverse(labels)
	return strings.Join(labels, ".") + "." + r.Version + "." + r.Kind
}

// Kubernetes' words for a custom resource's metadata, which kubectl
// explain shows for it.
const (
	metadataDoc     = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
	listMetadataDoc = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
)

func withDescription(s spec.Schema, doc string) spec.Schema {
	s.Description = doc
	return s
}

// idGroup is the group and version part of an operation id: CoreV1,
// AppsV1, CoordinationV1.
func (b *builder) idGroup() string {
	group := "core"
	if b.gv.Group != "" {
		group, _, _ = strings.Cut(b.gv.Group, ".")
	}
	return pascal(group) + pascal(b.gv.Version)
}

func (b *builder) idVerb(verb string) string { return verb + b.idGroup() }

func (b *builder) path(p string, params []*spec3.Parameter) *spec3.Path {
	if existing := b.paths[p]; existing != nil {
		return existing
	}
	all := append(append([]*spec3.Parameter{}, params...), queryParam("pretty", "string", "If 'true', then the output is pretty printed."))
	path := &spec3.Path{PathProps: spec3.PathProps{Parameters: all}}
	b.paths[p] = path
	return path
}

func (b *builder) op(id, action string, gvk schema.GroupVersionKind, query []*spec3.Parameter, req *spec3.RequestBody, resp *spec3.Responses) *spec3.Operation {
	tag := "core_" + b.gv.Version
	if b.gv.Group != "" {
		group, _, _ := strings.Cut(b.gv.Group, ".")
		tag = group + "_" + b.gv.Version
	}
	op := &spec3.Operation{OperationProps: spec3.OperationProps{
		Tags: []string{tag}, OperationId: id, Parameters: query, RequestBody: req, Responses: resp,
	}}
	op.AddExtension("x-kubernetes-action", action)
	op.AddExtension("x-kubernetes-group-version-kind", map[string]any{"group": gvk.Group, "version": gvk.Version, "kind": gvk.Kind})
	return op
}

// patchBody lists the patch types the server accepts; kubectl computes a
// strategic merge patch only when the PATCH operation offers one, which a
// custom resource's does not (as on Kubernetes).
func (b *builder) patchBody(custom bool) *spec3.RequestBody {
	media := []string{"application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"}
	if !custom {
		media = append(media, "application/strategic-merge-patch+json")
	}
	return body(b.schemas.ref(reflect.TypeFor[metav1.Patch]()), media...)
}

func (b *builder) deleteBody() *spec3.RequestBody {
	req := body(b.schemas.ref(reflect.TypeFor[metav1.DeleteOptions]()), writeMedia...)
	req.Required = false
	return req
}

var (
	writeMedia = []string{"application/json", "application/yaml", "application/vnd.kubernetes.protobuf"}
	readMedia  = []string{"application/json", "application/yaml", "application/vnd.kubernetes.protobuf"}
)

func body(s spec.Schema, media ...string) *spec3.RequestBody {
	content := map[string]*spec3.MediaType{}
	for _, m := range media {
		content[m] = &spec3.MediaType{MediaTypeProps: spec3.MediaTypeProps{Schema: &s}}
	}
	return &spec3.RequestBody{RequestBodyProps: spec3.RequestBodyProps{Content: content, Required: true}}
}

// responses pairs status codes with the schema each returns.
func responses(pairs ...any) *spec3.Responses {
	out := &spec3.Responses{ResponsesProps: spec3.ResponsesProps{StatusCodeResponses: map[int]*spec3.Response{
		401: {ResponseProps: spec3.ResponseProps{Description: "Unauthorized"}},
	}}}
	for i := 0; i+1 < len(pairs); i += 2 {
		code, s := pairs[i].(int), pairs[i+1].(spec.Schema)
		content := map[string]*spec3.MediaType{}
		for _, m := range readMedia {
			content[m] = &spec3.MediaType{MediaTypeProps: spec3.MediaTypeProps{Schema: &s}}
		}
		description := map[int]string{200: "OK", 201: "Created", 202: "Accepted"}[code]
		out.StatusCodeResponses[code] = &spec3.Response{ResponseProps: spec3.ResponseProps{Description: description, Content: content}}
	}
	return out
}

func pathParam(name, description string) *spec3.Parameter {
	return &spec3.Parameter{ParameterProps: spec3.ParameterProps{Name: name, In: "path", Required: true, Description: description,
		Schema: &spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"string"}, UniqueItems: true}}}}
}

func queryParam(name, typ, description string) *spec3.Parameter {
	return &spec3.Parameter{ParameterProps: spec3.ParameterProps{Name: name, In: "query", Description: description,
		Schema: &spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{typ}, UniqueItems: true}}}}
}

func listQuery() []*spec3.Parameter {
	return []*spec3.Parameter{
		queryParam("allowWatchBookmarks", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\"."),
		queryParam("continue", "string", "The continue option should be set when retrieving more results from the server."),
		queryParam("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields."),
		queryParam("labelSelector", "string", "A selector to restrict the list of returned objects by their labels."),
		queryParam("limit", "integer", "limit is a maximum number of responses to return for a list call."),
		queryParam("resourceVersion", "string", "resourceVersion sets a constraint on what resource versions a request may be served from."),
		queryParam("resourceVersionMatch", "string", "resourceVersionMatch determines how resourceVersion is applied to list calls."),
		queryParam("sendInitialEvents", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`."),
		queryParam("timeoutSeconds", "integer", "Timeout for the list/watch call."),
		queryParam("watch", "boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications."),
	}
}

// logQuery is pods/log's PodLogOptions.
func logQuery() []*spec3.Parameter {
	return []*spec3.Parameter{
		queryParam("container", "string", "The container for which to stream logs. Defaults to only container if there is one container in the pod."),
		queryParam("follow", "boolean", "Follow the log stream of the pod."),
		queryParam("limitBytes", "integer", "If set, the number of bytes to read from the server before terminating the log output."),
		queryParam("previous", "boolean", "Return previous terminated container logs."),
		queryParam("sinceSeconds", "integer", "A relative time in seconds before the current time from which to show logs."),
		queryParam("sinceTime", "string", "An RFC3339 timestamp from which to show logs."),
		queryParam("tailLines", "integer", "If set, the number of lines from the end of the logs to show."),
		queryParam("timestamps", "boolean", "If true, add an RFC3339 timestamp at the beginning of every line of log output."),
	}
}

// stringSchema is a plain-text response.
func stringSchema() spec.Schema {
	return spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{"string"}}}
}

func writeQuery() []*spec3.Parameter {
	return []*spec3.Parameter{
		queryParam("dryRun", "string", "When present, indicates that modifications should not be persisted."),
		queryParam("fieldManager", "string", "fieldManager is a name associated with the actor or entity that is making these changes."),
		queryParam("fieldValidation", "string", "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields: Ignore, Warn or Strict."),
	}
}

func patchQuery() []*spec3.Parameter {
	return append(writeQuery(), queryParam("force", "boolean", "Force is going to \"force\" Apply requests."))
}

func deleteQuery() []*spec3.Parameter {
	return []*spec3.Parameter{
		queryParam("dryRun", "string", "When present, indicates that modifications should not be persisted."),
		queryParam("gracePeriodSeconds", "integer", "The duration in seconds before the object should be deleted."),
		queryParam("orphanDependents", "boolean", "Deprecated: please use the PropagationPolicy."),
		queryParam("propagationPolicy", "string", "Whether and how garbage collection will be performed: Orphan, Background or Foreground."),
	}
}

func bearerToken() spec3.SecuritySchemes {
	return spec3.SecuritySchemes{"BearerToken": &spec3.SecurityScheme{SecuritySchemeProps: spec3.SecuritySchemeProps{
		Type: "apiKey", Name: "authorization", In: "header", Description: "Bearer Token authentication",
	}}}
}

func pascal(s string) string {
	if s == "" {
		return s
	}
	r := []rune(s)
	r[0] = unicode.ToUpper(r[0])
	return string(r)
}
