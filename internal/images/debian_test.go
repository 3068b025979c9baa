package images

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseStanzas(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Stanza
		wantErr string
	}{
		{
			name: "two paragraphs with a continuation",
			in:   "Package: libc6\nVersion: 2.36-9\nDescription: GNU C Library\n shared libraries\n .\n more\n\n\nPackage: zlib1g\r\nVersion: 1:1.2\r\n",
			want: []Stanza{
				{"Package": "libc6", "Version": "2.36-9", "Description": "GNU C Library\nshared libraries\n.\nmore"},
				{"Package": "zlib1g", "Version": "1:1.2"},
			},
		},
		{
			name: "clear-signed InRelease",
			in:   "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA512\n\nOrigin: Debian\nSHA256:\n " + strings.Repeat("a", 64) + " 12 main/binary-arm64/Packages.gz\n-----BEGIN PGP SIGNATURE-----\nabc\n-----END PGP SIGNATURE-----\n",
			want: []Stanza{{"Origin": "Debian", "SHA256": "\n" + strings.Repeat("a", 64) + " 12 main/binary-arm64/Packages.gz"}},
		},
		{name: "empty", in: "\n\n", want: nil},
		{name: "continuation first", in: " orphan\n", wantErr: "line 1: continuation line without a field"},
		{name: "no colon", in: "Package: a\nnonsense\n", wantErr: `line 2: "nonsense" is not a "Field: value" line`},
		{name: "space in field name", in: "Pack age: a\n", wantErr: "line 1:"},
		{name: "repeated field", in: "Package: a\nPackage: b\n", wantErr: "line 2: field Package repeated"},
		{name: "signed without signature", in: "-----BEGIN PGP SIGNED MESSAGE-----\n\nA: b\n", wantErr: "no signature block"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseStanzas(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseReleaseSHA256(t *testing.T) {
	sum := strings.Repeat("0f", 32)
	got, err := ParseReleaseSHA256(Stanza{"SHA256": "\n" + sum + " 42 main/binary-amd64/Packages.gz\n" + sum + " 7 main/Contents-all"})
	require.NoError(t, err)
	require.Equal(t, IndexFile{SHA256: sum, Size: 42, Path: "main/binary-amd64/Packages.gz"}, got["main/binary-amd64/Packages.gz"])
	require.Len(t, got, 2)

	for in, wantErr := range map[string]string{
		"":                       "",
		sum + " 42":              "SHA256 line 3: want",
		"xyz 42 a":               `"xyz" is not a SHA-256`,
		sum + " -1 a":            `size "-1" is not a byte count`,
		sum + " 4x a":            `size "4x" is not a byte count`,
		strings.Repeat("0f", 31): "want",
	} {
		if in == "" {
			_, err := ParseReleaseSHA256(Stanza{})
			require.ErrorContains(t, err, "no SHA256 field")
			continue
		}
		_, err := ParseReleaseSHA256(Stanza{"SHA256": "\n" + sum + " 1 ok\n" + in})
		require.ErrorContains(t, err, wantErr, in)
	}
}

func TestFindPackage(t *testing.T) {
	sum := strings.Repeat("ab", 32)
	libc := func(arch, size, file string) Stanza {
		return Stanza{"Package": "libc6", "Architecture": arch, "Version": "2.36-9", "Filename": file, "Size": size, "SHA256": sum}
	}
	good := libc("arm64", "100", "pool/main/g/glibc/libc6_2.36-9_arm64.deb")
	tests := []struct {
		name    string
		index   []Stanza
		want    Package
		wantErr string
	}{
		{name: "picks the arch", index: []Stanza{libc("amd64", "5", "pool/x.deb"), good, {"Package": "zlib1g", "Architecture": "arm64"}},
			want: Package{Name: "libc6", Version: "2.36-9", Arch: "arm64", Filename: good["Filename"], SHA256: sum, Size: 100}},
		{name: "absent", index: []Stanza{libc("amd64", "5", "pool/x.deb")}, wantErr: "package libc6 not in the arm64 index"},
		{name: "twice", index: []Stanza{good, good}, wantErr: "listed 2 times"},
		{name: "bad size", index: []Stanza{libc("arm64", "0", "pool/x.deb")}, wantErr: `Size "0"`},
		{name: "escaping filename", index: []Stanza{libc("arm64", "5", "pool/../../etc/passwd")}, wantErr: "leaves the mirror"},
		{name: "no filename", index: []Stanza{libc("arm64", "5", "")}, wantErr: "lacks Version or Filename"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FindPackage(tt.index, "libc6", "arm64")
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]string{"0.1.0\n": "0.1.0", "v1.2.3-rc.1": "v1.2.3-rc.1", "0.2.0\r\n": "0.2.0"} {
		got, err := ParseVersion(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got)
	}
	for _, in := range []string{"", "\n", "0.1.0\n\n", "1.0 beta", "-1", "1.0+build", strings.Repeat("a", 129)} {
		_, err := ParseVersion(in)
		require.ErrorContains(t, err, "is not an image tag", "%q", in)
	}
}
