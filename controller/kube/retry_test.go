package kube

import (
	"context"
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"
)

func TestRetryOnErrorKeepsCancellation(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "p", errors.New("changed"))
	wrappedCancel := fmt.Errorf("put: %w", context.Canceled)
	cases := []struct {
		name  string
		errs  []error // what fn returns, call by call (the last repeats)
		want  error
		calls int
	}{
		{"success", []error{nil}, nil, 1},
		{"conflict then success", []error{conflict, nil}, nil, 2},
		{"cancelled at once", []error{wrappedCancel}, context.Canceled, 1},
		{"conflict then cancelled", []error{conflict, context.Canceled}, context.Canceled, 2},
		{"conflicts to the end", []error{conflict}, conflict, retry.DefaultBackoff.Steps},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			fn := func() error {
				e := c.errs[min(calls, len(c.errs)-1)]
				calls++
				return e
			}
			err := retryOnConflict(fn)
			if !errors.Is(err, c.want) && err != c.want {
				t.Errorf("err %v, want %v", err, c.want)
			}
			if calls != c.calls {
				t.Errorf("%d calls, want %d", calls, c.calls)
			}
		})
	}
	// The trap this guards against, in client-go itself: if it is ever
	// fixed there, retryOnError can go.
	if err := retry.RetryOnConflict(retry.DefaultBackoff, func() error { return context.Canceled }); err != nil {
		t.Logf("client-go's RetryOnConflict now keeps a cancellation (%v); retryOnError may be removed", err)
	}
}
