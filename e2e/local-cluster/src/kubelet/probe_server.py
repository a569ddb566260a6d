# A tiny HTTP server for pod runner tests: it answers with what its container sees.
#   /file/<path>      the file at /<path>
#   /resolve/<name>   the address <name> resolves to
#   /env/<name>       an environment variable
#   /hostname         the hostname
#   /api/<path>       GET https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/<path> with
#                     the service account token and CA: "<status> <body>"
#   anything else     "ok <POD_NAME> <VERSION>"
import http.server, json, os, socket, ssl, sys, urllib.request

SA = '/var/run/secrets/kubernetes.io/serviceaccount/'

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        kind, _, arg = self.path[1:].partition('/')
        try:
            if kind == 'file':
                body = open('/' + arg).read()
            elif kind == 'resolve':
                body = socket.gethostbyname(arg)
            elif kind == 'env':
                body = os.environ.get(arg, '<unset>')
            elif kind == 'hostname':
                body = socket.gethostname()
            elif kind == 'api':
                url = 'https://%s:%s/%s' % (os.environ['KUBERNETES_SERVICE_HOST'],
                                            os.environ['KUBERNETES_SERVICE_PORT'], arg)
                ctx = ssl.create_default_context(cafile=SA + 'ca.crt')
                req = urllib.request.Request(url, headers={
                    'Authorization': 'Bearer ' + open(SA + 'token').read()})
                with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                    body = '%d %s' % (r.status, r.read().decode())
            else:
                body = 'ok %s %s' % (os.environ.get('POD_NAME', ''), os.environ.get('VERSION', ''))
            code = 200
        except Exception as e:
            body, code = 'error: %s' % e, 500
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(('', int(os.environ.get('PORT', '8080'))), H).serve_forever()
