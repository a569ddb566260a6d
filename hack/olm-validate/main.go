// olm-validate runs the operator-framework's own bundle validators
// (github.com/operator-framework/api/pkg/validation) on one OLM bundle directory, as
// OperatorHub's and OLM's pipelines judge a bundle. It is built and cached by
// hack/install-olm-validate; the Rust test e2e/tests/it/olm_bundle.rs runs it.
//
//	olm-validate [--k8s-version 1.36] [--warnings-as-errors] DIR
//
// Every problem is printed as one line, "error: ..." or "warning: ...". The exit code is 1 when
// a validator reports an error (or a warning, with --warnings-as-errors), 2 when the bundle
// cannot be loaded or the arguments are wrong, 0 otherwise.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
)

func main() {
	k8sVersion := flag.String("k8s-version", "",
		"the Kubernetes version the bundle is meant for (the deprecated-API checks' k8s-version)")
	warningsAsErrors := flag.Bool("warnings-as-errors", false, "exit 1 on warnings too")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: olm-validate [--k8s-version X.Y] [--warnings-as-errors] BUNDLE_DIR")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	dir := flag.Arg(0)

	bundle, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "olm-validate: cannot load the bundle in %s: %v\n", dir, err)
		os.Exit(2)
	}
	if bundle == nil || bundle.CSV == nil {
		fmt.Fprintf(os.Stderr, "olm-validate: %s holds no ClusterServiceVersion\n", dir)
		os.Exit(2)
	}

	// The defaults (CSV, CRDs, bundle) and the optional ones a catalog runs: OperatorHub's,
	// the good practices, the removed-API check, and the standalone objects' checks.
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator,
		validation.AlphaDeprecatedAPIsValidator,
		validation.ObjectValidator,
	)
	objects := bundle.ObjectsToValidate() // the CRDs, the CSV, other objects and the bundle
	if *k8sVersion != "" {
		objects = append(objects, map[string]string{"k8s-version": *k8sVersion})
	}

	var nErrors, nWarnings int
	for _, result := range validators.Validate(objects...) {
		nErrors += report("error", result.Name, result.Errors)
		nWarnings += report("warning", result.Name, result.Warnings)
	}
	fmt.Printf("olm-validate: %s (%s): %d errors, %d warnings\n", dir, bundle.CSV.GetName(), nErrors, nWarnings)
	if nErrors > 0 || (*warningsAsErrors && nWarnings > 0) {
		os.Exit(1)
	}
}

func report(level, name string, problems []errors.Error) int {
	for _, p := range problems {
		fmt.Printf("%s: %s: %s\n", level, name, p.Error())
	}
	return len(problems)
}
