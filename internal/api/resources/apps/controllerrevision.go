package apps

import (
	"strings"

	"github.com/orch-dev/orch/internal/api/resources"
	appsv1 "k8s.io/api/apps/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// controllerRevisions are the StatefulSets' (and, in Kubernetes,
// DaemonSets') template history: `kubectl rollout history` and `undo`
// read them.
func controllerRevisions() *resources.Resource {
	return resources.Described[appsv1.ControllerRevision, appsv1.ControllerRevisionList](&resources.Resource{
		GroupVersionKind: resources.GVK("apps", "ControllerRevision"), Plural: "controllerrevisions", Singular: "controllerrevision", Namespaced: true,
		StorageKey: "controllerrevisions",
		Validate: resources.TypedValidate(func(r *appsv1.ControllerRevision) field.ErrorList {
			if r.Revision < 0 {
				return field.ErrorList{field.Invalid(field.NewPath("revision"), r.Revision, "must be greater than or equal to 0")}
			}
			return nil
		}),
		ValidateUpdate: resources.TypedValidateUpdate(func(r, old *appsv1.ControllerRevision) field.ErrorList {
			if !apiequality.Semantic.DeepEqual(r.Data, old.Data) {
				return field.ErrorList{field.Invalid(field.NewPath("data"), "", "field is immutable")}
			}
			return nil
		}),
		Columns: controllerRevisionColumns, Row: resources.TypedRow(controllerRevisionRow),
	})
}

var controllerRevisionColumns = []metav1.TableColumnDefinition{
	resources.NameCol,
	resources.Col("Controller", "string", 0, "Controller of the object"),
	resources.Col("Revision", "integer", 0, appsv1.ControllerRevision{}.SwaggerDoc()["revision"]),
	resources.AgeCol,
}

func controllerRevisionRow(r *appsv1.ControllerRevision) []any {
	controller := "<none>"
	if ref := metav1.GetControllerOf(r); ref != nil {
		controller = strings.ToLower(ref.Kind) + "." + groupOf(ref.APIVersion) + "/" + ref.Name
	}
	return []any{r.Name, controller, r.Revision, resources.Age(r.CreationTimestamp)}
}

// groupOf is the group of an apiVersion ("apps/v1" is apps, "v1" none).
func groupOf(apiVersion string) string {
	group, _, found := strings.Cut(apiVersion, "/")
	if !found {
		return ""
	}
	return group
}
