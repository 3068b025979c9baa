package images

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// VersionFile is the repository's version: the images' tag and the
// chart's appVersion (a test checks they agree).
const VersionFile = "VERSION"

// tagPattern is the OCI distribution spec's tag grammar.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// CheckVersion says whether v can be an image tag.
func CheckVersion(v string) error {
	if !tagPattern.MatchString(v) {
		return fmt.Errorf("version %q is not an image tag ([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})", truncate(v, 140))
	}
	return nil
}

// ParseVersion reads the content of a VERSION file: one tag, optionally
// followed by a newline; anything else is an error.
func ParseVersion(content string) (string, error) {
	v := strings.TrimSuffix(strings.TrimSuffix(content, "\n"), "\r")
	if err := CheckVersion(v); err != nil {
		return "", fmt.Errorf("%s: %w", VersionFile, err)
	}
	return v, nil
}

// ReadVersion reads repoDir/VERSION.
func ReadVersion(repoDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repoDir, VersionFile))
	if err != nil {
		return "", fmt.Errorf("reading the version: %w", err)
	}
	return ParseVersion(string(b))
}
