package nodes

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// codecs decode the API types the agent reads: core/v1 and
// networking.k8s.io/v1 (no generated clientset: it would register every
// API group in the agent binary).
var codecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // static registration of generated types: cannot fail at run time
		}
	}
	return serializer.NewCodecFactory(s)
}()

// RESTClient is a REST client of one API group version (core/v1 or
// networking.k8s.io/v1) on cfg's server, protobuf on the wire when asked
// (lists and watches), JSON otherwise, with userAgent unless cfg has one.
func RESTClient(cfg *rest.Config, gv schema.GroupVersion, protobuf bool, userAgent string) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.APIPath = "/apis"
	if gv.Group == "" {
		c.APIPath = "/api"
	}
	c.GroupVersion = &gv
	c.NegotiatedSerializer = codecs.WithoutConversion()
	if protobuf {
		c.ContentType = runtime.ContentTypeProtobuf
		c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	if c.UserAgent == "" {
		c.UserAgent = userAgent
	}
	return rest.RESTClientFor(c)
}
