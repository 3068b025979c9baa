package kube

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// retryOnError is client-go's retry.OnError without its trap: OnError reads
// an error of fn that is context.Canceled or DeadlineExceeded as an
// interrupted wait and returns the last retriable error instead, which is
// nil when there was none. A commit cut short by a lost leadership (its
// context cancelled) then looked like a success: a claim "reserved" with no
// object back, a pod "bound" that was not. Here fn's own last error wins.
func retryOnError(backoff wait.Backoff, retriable func(error) bool, fn func() error) error {
	var last error
	err := retry.OnError(backoff, retriable, func() error {
		last = fn()
		return last
	})
	if last != nil {
		return last // fn's final error, whatever OnError made of it
	}
	return err
}

// retryOnConflict is retry.RetryOnConflict through retryOnError.
func retryOnConflict(fn func() error) error {
	return retryOnError(retry.DefaultBackoff, apierrors.IsConflict, fn)
}
