package openapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	openapiv2 "github.com/google/gnostic-models/openapiv2"
	"github.com/orch-dev/orch/internal/api/resources"
	"google.golang.org/protobuf/proto"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// SwaggerV2 is the OpenAPI v2 (Swagger 2.0) document of everything served,
// as Kubernetes publishes at /openapi/v2 for the clients that read it
// (Helm 3's validation, older kubectl): the v3 documents' schemas as
// definitions, with plain $refs as v2 has them.
func SwaggerV2(served []*resources.Resource) *spec.Swagger {
	definitions := spec.Definitions{}
	for _, gv := range GroupVersions(served) {
		for name, schema := range Document(gv, served).Components.Schemas {
			if existing, ok := definitions[name]; ok {
				// A kind served in several groups (DeleteOptions, WatchEvent)
				// is one definition naming each.
				mergeGVKs(&existing, schema)
				definitions[name] = existing
				continue
			}
			definitions[name] = toV2(*schema)
		}
	}
	for _, r := range served {
		if r.OpenAPISchemaV2 == nil {
			continue
		}
		name := customName(r)
		v2 := *r.OpenAPISchemaV2
		if preserve, _ := r.OpenAPISchema.Extensions.GetBool("x-kubernetes-preserve-unknown-fields"); !preserve {
			// Its own fields as v2 has them, with the ones every object has.
			v2.Properties = map[string]spec.Schema{}
			for k, p := range r.OpenAPISchemaV2.Properties {
				v2.Properties[k] = p
			}
			for _, k := range []string{"apiVersion", "kind", "metadata"} {
				v2.Properties[k] = definitions[name].Properties[k]
			}
		}
		definitions[name] = toV2(v2)
	}
	return &spec.Swagger{SwaggerProps: spec.SwaggerProps{
		Swagger:     "2.0",
		Info:        &spec.Info{InfoProps: spec.InfoProps{Title: "Kubernetes", Version: "unversioned"}},
		Paths:       &spec.Paths{Paths: map[string]spec.PathItem{}},
		Definitions: definitions,
		SecurityDefinitions: spec.SecurityDefinitions{"BearerToken": &spec.SecurityScheme{SecuritySchemeProps: spec.SecuritySchemeProps{
			Type: "apiKey", Name: "authorization", In: "header", Description: "Bearer Token authentication"}}},
		Security: []map[string][]string{{"BearerToken": {}}},
	}}
}

// toV2 rewrites a v3 schema for v2: references point into #/definitions/,
// and a reference with a description (allOf of one $ref in v3) is a bare
// $ref.
func toV2(s spec.Schema) spec.Schema {
	if len(s.AllOf) == 1 && s.AllOf[0].Ref.String() != "" {
		ref := s.AllOf[0].Ref.String()
		s.AllOf = nil
		s.Ref = spec.MustCreateRef(strings.Replace(ref, "#/components/schemas/", "#/definitions/", 1))
	}
	if s.Items != nil && s.Items.Schema != nil {
		items := toV2(*s.Items.Schema)
		s.Items = &spec.SchemaOrArray{Schema: &items}
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		values := toV2(*s.AdditionalProperties.Schema)
		s.AdditionalProperties = &spec.SchemaOrBool{Allows: true, Schema: &values}
	}
	if len(s.Properties) > 0 {
		props := make(map[string]spec.Schema, len(s.Properties))
		for k, p := range s.Properties {
			props[k] = toV2(p)
		}
		s.Properties = props
	}
	if len(s.OneOf) > 0 {
		// v2 has no oneOf: IntOrString is a string with its format.
		s.OneOf = nil
		if s.Format == "int-or-string" {
			s.Type = spec.StringOrArray{"string"}
		}
	}
	return s
}

func mergeGVKs(into *spec.Schema, from *spec.Schema) {
	add, _ := from.Extensions["x-kubernetes-group-version-kind"].([]any)
	have, _ := into.Extensions["x-kubernetes-group-version-kind"].([]any)
	if len(add) == 0 {
		return
	}
	seen := map[string]bool{}
	for _, g := range have {
		seen[fmt.Sprint(g)] = true
	}
	for _, g := range add {
		if !seen[fmt.Sprint(g)] {
			have = append(have, g)
		}
	}
	into.AddExtension("x-kubernetes-group-version-kind", have)
}

// protobufV2 is the media type of /openapi/v2 in protobuf, which
// client-go's discovery asks for (spelled with an @ that Go's mime parser
// refuses in a Content-Type, so the answer spells it with a dot, as
// Kubernetes' does).
const protobufV2 = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

// V2Handler serves /openapi/v2 as JSON, or as protobuf to clients that ask
// (client-go's OpenAPISchema), built on first request.
type V2Handler struct {
	src Source
	doc perGeneration[*v2Doc]
}

type v2Doc struct {
	json, pb compressed
	etag     string
	err      error
}

// NewV2Handler serves the v2 document of the source's resources.
func NewV2Handler(src Source) *V2Handler { return &V2Handler{src: src} }

func buildV2(served []*resources.Resource) *v2Doc {
	d := &v2Doc{}
	body, err := json.Marshal(SwaggerV2(served))
	if err != nil {
		d.err = err
		return d
	}
	doc, err := openapiv2.ParseDocument(body)
	if err != nil {
		d.err = fmt.Errorf("openapi v2 document: %w", err)
		return d
	}
	pb, err := proto.Marshal(doc)
	if err != nil {
		d.err = err
		return d
	}
	if d.json, d.err = compress(body); d.err != nil {
		return d
	}
	d.pb, d.err = compress(pb)
	d.etag = fmt.Sprintf(`"%X"`, hashOf(body))
	return d
}

func (h *V2Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := h.doc.get(h.src, buildV2)
	if !servable(w, r, d.err) {
		return
	}
	body, contentType := d.json, "application/json"
	if accept := r.Header.Get("Accept"); strings.Contains(accept, "application/com.github.proto-openapi.spec.v2") {
		body, contentType = d.pb, protobufV2
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Etag", d.etag)
	w.Header().Set("Vary", "Accept, Accept-Encoding")
	if r.Header.Get("If-None-Match") == d.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body.write(w, r)
}
