package release

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
)

// CheckSkew says whether a machine on from may move to to, by
// Kubernetes' version skew rules as k3s's upgrades apply them: no
// downgrade, no minor version skipped (v0.3 to v0.5 goes through v0.4),
// a new major only at its first minor. force allows any move between
// versions, even builds that carry none (v0.0.0-dev, a commit).
func CheckSkew(from, to string, force bool) error {
	target, err := version.ParseSemantic(to)
	if err != nil {
		return fmt.Errorf("version %q is no semantic version (vMAJOR.MINOR.PATCH)", to)
	}
	if force {
		return nil
	}
	current, err := version.ParseSemantic(from)
	if err != nil || from == DevVersion {
		return fmt.Errorf("the running version %q is a development build: say force to replace it", from)
	}
	switch {
	case target.LessThan(current):
		return fmt.Errorf("%s is older than the running %s: a downgrade needs force (and a snapshot of the store: an older server may not read what a newer one wrote)", to, from)
	case target.Major() > current.Major()+1 || target.Major() == current.Major()+1 && target.Minor() != 0:
		return fmt.Errorf("%s skips a major version from %s: upgrade to v%d.0 first", to, from, current.Major()+1)
	case target.Major() == current.Major() && target.Minor() > current.Minor()+1:
		return fmt.Errorf("%s skips a minor version from %s: upgrade to v%d.%d first", to, from, current.Major(), current.Minor()+1)
	}
	return nil
}

// Older says a is a version before b; a build that carries no version
// (a development build) is older than any release.
func Older(a, b string) bool {
	vb, err := version.ParseSemantic(b)
	if err != nil {
		return false
	}
	va, err := version.ParseSemantic(a)
	if err != nil || a == DevVersion {
		return true
	}
	return va.LessThan(vb)
}
