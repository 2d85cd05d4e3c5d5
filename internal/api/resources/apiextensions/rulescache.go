package apiextensions

import (
	"crypto/sha256"
	"encoding/json"
	"sync"

	"github.com/orch-dev/orch/internal/api/customresource"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateRules compiles a schema's CEL rules: defaultValidateRules, which
// tests count calls of.
var validateRules = defaultValidateRules

var defaultValidateRules = customresource.ValidateRules

// compiledSchemas remembers the schemas whose rules compiled within their
// cost limits. A definition is validated whole on every write, its status
// and finalizers included, and compiling the rules of the Gateway API's
// definitions took 0.4 s of CPU at each server start (the server writes
// their status) before anything had changed: a schema seen valid is not
// compiled again. Bounded: past maxCompiledSchemas it starts afresh.
var compiledSchemas = struct {
	sync.Mutex
	valid map[[sha256.Size]byte]struct{}
}{valid: map[[sha256.Size]byte]struct{}{}}

const maxCompiledSchemas = 256

// validateRulesOnce is validateRules, skipped for a schema whose rules
// compiled before. Only success is remembered: a schema with a bad rule
// is refused with its errors every time.
func validateRulesOnce(schema *apiextensionsv1.JSONSchemaProps, structural *structuralschema.Structural, path *field.Path) field.ErrorList {
	body, err := json.Marshal(schema)
	if err != nil {
		return validateRules(structural, path)
	}
	key := sha256.Sum256(body)
	compiledSchemas.Lock()
	_, seen := compiledSchemas.valid[key]
	compiledSchemas.Unlock()
	if seen {
		return nil
	}
	errs := validateRules(structural, path)
	if len(errs) == 0 {
		compiledSchemas.Lock()
		if len(compiledSchemas.valid) >= maxCompiledSchemas {
			clear(compiledSchemas.valid)
		}
		compiledSchemas.valid[key] = struct{}{}
		compiledSchemas.Unlock()
	}
	return errs
}
