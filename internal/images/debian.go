package images

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// DebianMirror and DebianSuite are where glibc comes from. The suite is the
// one the build machine compiles against (Debian 12): a binary linked
// against its glibc headers needs that glibc or newer at run time.
const (
	DebianMirror = "https://deb.debian.org/debian"
	DebianSuite  = "bookworm"
)

// Stanza is one paragraph of a Debian control file (Packages, InRelease):
// field names as written, values with continuation lines joined by "\n".
type Stanza map[string]string

// maxStanzaField bounds one field's value: the biggest in a Packages index
// (Description) is a few kilobytes; the SHA256 list of an InRelease file is
// about 100 KB.
const maxStanzaField = 4 << 20

// ParseStanzas reads deb822 paragraphs (Debian Policy 5.1): "Field: value"
// lines, continuation lines starting with a space or tab, paragraphs
// separated by blank lines. An OpenPGP clear-signed wrapper (InRelease) is
// skipped. It reports the line of the first malformed input.
func ParseStanzas(r io.Reader) ([]Stanza, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxStanzaField)
	var (
		out     []Stanza
		cur     Stanza
		last    string
		line    int
		signed  bool
		inArmor bool
	)
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		switch {
		case line == 1 && text == "-----BEGIN PGP SIGNED MESSAGE-----":
			signed, inArmor = true, true
			continue
		case signed && inArmor:
			// The armor headers ("Hash: SHA512") end at the first blank line.
			if text == "" {
				inArmor = false
			}
			continue
		case signed && text == "-----BEGIN PGP SIGNATURE-----":
			if cur != nil {
				out = append(out, cur)
			}
			return out, nil
		}
		if strings.TrimSpace(text) == "" {
			if cur != nil {
				out = append(out, cur)
			}
			cur, last = nil, ""
			continue
		}
		if text[0] == ' ' || text[0] == '\t' {
			if last == "" {
				return nil, fmt.Errorf("line %d: continuation line without a field", line)
			}
			cur[last] += "\n" + strings.TrimSpace(text)
			continue
		}
		name, value, ok := strings.Cut(text, ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("line %d: %q is not a \"Field: value\" line", line, truncate(text, 60))
		}
		if cur == nil {
			cur = Stanza{}
		}
		if _, dup := cur[name]; dup {
			return nil, fmt.Errorf("line %d: field %s repeated in one paragraph", line, name)
		}
		cur[name], last = strings.TrimSpace(value), name
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	if signed {
		return nil, errors.New("clear-signed file has no signature block")
	}
	if cur != nil {
		out = append(out, cur)
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// IndexFile is one line of a Release file's SHA256 field.
type IndexFile struct {
	SHA256 string
	Size   int64
	Path   string
}

// ParseReleaseSHA256 reads the SHA256 field of a Release/InRelease
// paragraph: "<sha256> <size> <path>" per line.
func ParseReleaseSHA256(s Stanza) (map[string]IndexFile, error) {
	field, ok := s["SHA256"]
	if !ok {
		return nil, errors.New("release file has no SHA256 field")
	}
	out := map[string]IndexFile{}
	for i, l := range strings.Split(field, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 3 {
			return nil, fmt.Errorf("SHA256 line %d: want \"<sha256> <size> <path>\", got %q", i+1, truncate(l, 80))
		}
		if err := checkSHA256(f[0]); err != nil {
			return nil, fmt.Errorf("SHA256 line %d: %w", i+1, err)
		}
		size, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || size < 0 {
			return nil, fmt.Errorf("SHA256 line %d: size %q is not a byte count", i+1, f[1])
		}
		out[f[2]] = IndexFile{SHA256: f[0], Size: size, Path: f[2]}
	}
	return out, nil
}

func checkSHA256(s string) error {
	if b, err := hex.DecodeString(s); err != nil || len(b) != sha256.Size {
		return fmt.Errorf("%q is not a SHA-256 in hex", truncate(s, 80))
	}
	return nil
}

// Package is what the image build needs of one binary package.
type Package struct {
	Name, Version, Arch, Filename, SHA256 string
	Size                                  int64
}

// FindPackage picks name's paragraph for arch from a Packages index. An
// index holds one version of each package per suite; two would be a
// malformed index, reported rather than guessed between.
func FindPackage(stanzas []Stanza, name, arch string) (Package, error) {
	var found []Package
	for _, s := range stanzas {
		if s["Package"] != name || s["Architecture"] != arch {
			continue
		}
		p := Package{Name: name, Version: s["Version"], Arch: arch, Filename: s["Filename"], SHA256: s["SHA256"]}
		size, err := strconv.ParseInt(s["Size"], 10, 64)
		switch {
		case p.Version == "" || p.Filename == "":
			return Package{}, fmt.Errorf("package %s/%s: paragraph lacks Version or Filename", name, arch)
		case err != nil || size <= 0:
			return Package{}, fmt.Errorf("package %s/%s %s: Size %q is not a byte count", name, arch, p.Version, s["Size"])
		case strings.Contains(p.Filename, "..") || strings.HasPrefix(p.Filename, "/"):
			return Package{}, fmt.Errorf("package %s/%s %s: Filename %q leaves the mirror", name, arch, p.Version, p.Filename)
		}
		if err := checkSHA256(p.SHA256); err != nil {
			return Package{}, fmt.Errorf("package %s/%s %s: %w", name, arch, p.Version, err)
		}
		p.Size = size
		found = append(found, p)
	}
	switch len(found) {
	case 0:
		return Package{}, fmt.Errorf("package %s not in the %s index", name, arch)
	case 1:
		return found[0], nil
	}
	return Package{}, fmt.Errorf("package %s/%s listed %d times in one index", name, arch, len(found))
}

// debFetcher downloads Debian packages into a cache, verifying each file
// against the hash its parent lists: InRelease → Packages.gz → .deb. The
// InRelease file is fetched over HTTPS and not OpenPGP-verified (no keyring
// is assumed on the build machine); TLS to the mirror is the trust root.
type debFetcher struct {
	mirror, suite, cache string
	client               *http.Client
}

// fetchDeb returns the path of name's .deb for arch, downloading it when
// the cache lacks the version the mirror lists. With the mirror
// unreachable it falls back to the newest cached version and says so.
func (f debFetcher) fetchDeb(ctx context.Context, name, arch string) (string, Package, error) {
	logger := klog.FromContext(ctx).WithValues("package", name, "arch", arch)
	pkg, err := f.resolve(ctx, name, arch)
	if err != nil {
		cached, cerr := f.newestCached(name, arch)
		if cerr != nil {
			return "", Package{}, fmt.Errorf("%w (and no cached copy: %v)", err, cerr)
		}
		logger.Info("Debian mirror unreachable; using the cached package", "err", err, "deb", cached)
		return cached, Package{Name: name, Arch: arch}, nil
	}
	dst := filepath.Join(f.cache, "debian", fmt.Sprintf("%s_%s_%s.deb", name, strings.ReplaceAll(pkg.Version, ":", "%3a"), arch))
	if ok, _ := fileHasSHA256(dst, pkg.SHA256); ok {
		return dst, pkg, nil
	}
	logger.Info("Downloading", "version", pkg.Version, "bytes", pkg.Size)
	if err := f.download(ctx, f.mirror+"/"+pkg.Filename, dst, pkg.SHA256, pkg.Size); err != nil {
		return "", Package{}, err
	}
	return dst, pkg, nil
}

func (f debFetcher) resolve(ctx context.Context, name, arch string) (Package, error) {
	rel, err := f.get(ctx, f.mirror+"/dists/"+f.suite+"/InRelease", 1<<24)
	if err != nil {
		return Package{}, err
	}
	stanzas, err := ParseStanzas(bytes.NewReader(rel))
	if err != nil || len(stanzas) == 0 {
		return Package{}, fmt.Errorf("parsing %s InRelease: %v", f.suite, err)
	}
	files, err := ParseReleaseSHA256(stanzas[0])
	if err != nil {
		return Package{}, fmt.Errorf("%s InRelease: %w", f.suite, err)
	}
	rel1 := "main/binary-" + arch + "/Packages.gz"
	idx, ok := files[rel1]
	if !ok {
		return Package{}, fmt.Errorf("%s InRelease lists no %s", f.suite, rel1)
	}
	// Indexes are cached by hash, so an unchanged suite costs one small request.
	idxPath := filepath.Join(f.cache, "debian", "index", idx.SHA256+".Packages.gz")
	if ok, _ := fileHasSHA256(idxPath, idx.SHA256); !ok {
		if err := f.download(ctx, f.mirror+"/dists/"+f.suite+"/"+rel1, idxPath, idx.SHA256, idx.Size); err != nil {
			return Package{}, err
		}
	}
	file, err := os.Open(idxPath)
	if err != nil {
		return Package{}, fmt.Errorf("opening Packages index: %w", err)
	}
	defer file.Close()
	zr, err := gzip.NewReader(file)
	if err != nil {
		return Package{}, fmt.Errorf("%s: %w", idxPath, err)
	}
	all, err := ParseStanzas(zr)
	if err != nil {
		return Package{}, fmt.Errorf("%s %s: %w", f.suite, rel1, err)
	}
	return FindPackage(all, name, arch)
}

func (f debFetcher) get(ctx context.Context, url string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("GET %s: more than %d bytes", url, limit)
	}
	return b, nil
}

// download writes url to dst only when its content has the given hash and
// size, through a temporary file so that a cut transfer leaves nothing.
func (f debFetcher) download(ctx context.Context, url, dst, sum string, size int64) error {
	b, err := f.get(ctx, url, size)
	if err != nil {
		return err
	}
	got := sha256.Sum256(b)
	if int64(len(b)) != size || hex.EncodeToString(got[:]) != sum {
		return fmt.Errorf("GET %s: got %d bytes with SHA-256 %x, the index lists %d bytes with %s", url, len(b), got, size, sum)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("creating cache dir: %w", err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("storing %s: %w", dst, err)
	}
	return nil
}

func (f debFetcher) newestCached(name, arch string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(f.cache, "debian", name+"_*_"+arch+".deb"))
	if err != nil || len(matches) == 0 {
		return "", fmt.Errorf("no %s_*_%s.deb in %s", name, arch, filepath.Join(f.cache, "debian"))
	}
	// Debian version order is not lexical in general; glibc's point
	// releases (+deb12uN) differ only in N, so sort by modification time.
	sort.Slice(matches, func(i, j int) bool { return modTime(matches[i]) > modTime(matches[j]) })
	return matches[0], nil
}

func modTime(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.ModTime().UnixNano()
}

func fileHasSHA256(path, sum string) (bool, error) {
	file, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer file.Close()
	h := sha256.New()
	if _, err := io.Copy(h, file); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == sum, nil
}
