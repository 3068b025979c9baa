package images

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestChartDefaultsMatchImages checks that the chart installs by default
// the images `make images` builds: same registry, names, and a tag (the
// chart's appVersion) equal to the VERSION file.
func TestChartDefaultsMatchImages(t *testing.T) {
	version, err := ReadVersion("../..")
	require.NoError(t, err)

	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	readYAML(t, "../../chart/tessera/Chart.yaml", &chart)
	require.Equal(t, version, chart.AppVersion, "chart/tessera/Chart.yaml appVersion must be the VERSION file's content")

	type image struct {
		Repository string `json:"repository"`
		Tag        string `json:"tag"`
	}
	var values struct {
		Image struct {
			Registry   string `json:"registry"`
			Node       image  `json:"node"`
			Controller image  `json:"controller"`
		} `json:"image"`
	}
	readYAML(t, "../../chart/tessera/values.yaml", &values)
	require.Equal(t, DefaultRegistry, values.Image.Registry, "values.yaml image.registry")
	specs := map[string]bool{}
	for _, s := range DefaultSpecs() {
		specs[s.Name] = true
	}
	for key, img := range map[string]image{"node": values.Image.Node, "controller": values.Image.Controller} {
		require.True(t, specs[img.Repository], "values.yaml image.%s.repository %q is not an image make images builds", key, img.Repository)
		require.Empty(t, img.Tag, "values.yaml image.%s.tag: empty means the chart's appVersion, the tag make images gives", key)
	}
	require.Equal(t, NodeImage, values.Image.Node.Repository)
	require.Equal(t, ControllerImage, values.Image.Controller.Repository)
}

func readYAML(t *testing.T, path string, into any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, into), path)
}
