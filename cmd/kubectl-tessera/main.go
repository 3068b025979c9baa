// kubectl-tessera is a kubectl plugin: on the PATH, `kubectl tessera ...`
// runs it. See ctl for the commands.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tessera-gpu/tessera/cmd/kubectl-tessera/ctl"
)

func main() {
	fs := flag.NewFlagSet("kubectl-tessera", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "path to the kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
	kubeContext := fs.String("context", "", "the kubeconfig context to use")
	var namespace string
	fs.StringVar(&namespace, "namespace", "", "namespace of the pod for why (default: the context's)")
	fs.StringVar(&namespace, "n", "", "shorthand for --namespace")
	fs.Usage = func() { fmt.Fprint(os.Stderr, ctl.Usage) }
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	// Flags may also follow the command (kubectl tessera why mypod -n team).
	args := fs.Args()
	var rest []string
	for len(args) > 0 {
		rest = append(rest, args[0])
		if rest[0] == "snapshot" || rest[0] == "shadow" {
			// snapshot and shadow parse their own flags (-o, --address,
			// ...): the plugin's own go before the command.
			rest = append(rest, args[1:]...)
			break
		}
		if err := fs.Parse(args[1:]); err != nil {
			os.Exit(2)
		}
		args = fs.Args()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: *kubeContext})
	cfg, err := loader.ClientConfig()
	if err != nil {
		fail(err)
	}
	if namespace == "" {
		if namespace, _, err = loader.Namespace(); err != nil {
			fail(err)
		}
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := ctl.Run(ctx, ctl.Clients{Kube: kc, Dynamic: dc, Namespace: namespace, RestConfig: cfg}, rest, os.Stdout); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kubectl tessera: %v\n", err)
	os.Exit(1)
}
