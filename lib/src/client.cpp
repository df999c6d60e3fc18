#include <reaper/client.hpp>

#include "errno_text.hpp"

#include <Poco/Exception.h>
#include <Poco/JSON/Array.h>
#include <Poco/JSON/Object.h>
#include <Poco/JSON/Parser.h>
#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/IPAddress.h>
#include <Poco/Net/InvalidCertificateHandler.h>
#include <Poco/Net/NetException.h>
#include <Poco/Net/SSLException.h>
#include <Poco/Net/SecureStreamSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/Net/VerificationErrorArgs.h>
#include <Poco/StreamCopier.h>
#include <Poco/URI.h>

#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <sys/socket.h>

namespace reaper {

using Poco::JSON::Array;
using Poco::JSON::Object;
using Poco::Net::HTTPRequest;
using Poco::Net::HTTPResponse;

// ---- query helpers ----------------------------------------------------------------------

std::string url_encode(std::string_view text) {
    std::string out;
    // Everything but RFC 3986's unreserved characters is escaped.
    Poco::URI::encode(std::string(text), "!#$&'()*+,/:;=?@[]{}\"%<>\\^`| ", out);
    return out;
}

std::string encode_filters(const Filters& filters) {
    Object object;
    for (const auto& [key, values] : filters) {
        Array array;
        for (const auto& v : values) array.add(v);
        object.set(key, array);
    }
    std::ostringstream out;
    object.stringify(out);
    return out.str();
}

int compare_api_versions(std::string_view a, std::string_view b) {
    // Each read consumes a number and its '.', or ends the version: anything but a '.' after
    // a number ("-rc1", a letter) empties it, so the loop below always terminates.
    auto next = [](std::string_view& s) {
        unsigned value = 0;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
        if (ec == std::errc::result_out_of_range) value = std::numeric_limits<unsigned>::max();
        s.remove_prefix(static_cast<std::size_t>(end - s.data()));
        if (!s.empty() && s.front() == '.') {
            s.remove_prefix(1);
        } else {
            s = {};
        }
        return value;
    };
    while (!a.empty() || !b.empty()) {
        unsigned x = next(a), y = next(b);
        if (x != y) return x < y ? -1 : 1;
    }
    return 0;
}

bool is_api_version(std::string_view text) {
    auto dot = text.find('.');
    if (dot == std::string_view::npos || dot == 0 || dot + 1 == text.size() || dot > 4 || text.size() - dot > 5)
        return false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (i != dot && (text[i] < '0' || text[i] > '9')) return false;
    }
    return true;
}

std::string api_version_from_environment() {
    const char* pinned = std::getenv("DOCKER_API_VERSION");
    if (!pinned || !*pinned) return {};
    if (!is_api_version(pinned)) {
        throw std::invalid_argument(std::string("DOCKER_API_VERSION=") + pinned +
                                    ": not an API version (expected digits, a dot, digits, e.g. 1.44)");
    }
    return pinned;
}

// ---- connections ------------------------------------------------------------------------

namespace {

struct Connection {
    Poco::Net::StreamSocket socket;  // a SecureStreamSocket under TLS
    std::unique_ptr<Poco::Net::HTTPClientSession> http;
    bool reused = false;
};

// Ends a connection's traffic from another thread than the one using it: shutdown(2) of its
// fd, which makes a blocked read return. Not StreamSocket::shutdown(): on a TLS socket that
// writes a close_notify through the SSL object the other thread is reading with, and an
// OpenSSL connection must not be used from two threads at once.
void interrupt(Poco::Net::StreamSocket& socket) noexcept {
    ::shutdown(socket.impl()->sockfd(), SHUT_RDWR);
}

// Why OpenSSL rejected the engine's certificate, kept for the connect() that asked: Poco's
// verify callback reports it to the context's handler on the connecting thread, and the
// handshake error itself only says "certificate verify failed".
thread_local std::string certificate_problem;

class RecordCertificateProblem final : public Poco::Net::InvalidCertificateHandler {
public:
    RecordCertificateProblem() : InvalidCertificateHandler(false) {}
    void onInvalidCertificate(const void*, Poco::Net::VerificationErrorArgs& args) override {
        if (!certificate_problem.empty()) return;  // the first problem is the cause
        certificate_problem = args.errorMessage() + " (certificate " + args.certificate().subjectName() +
                              ", issued by " + args.certificate().issuerName() + ")";
    }
};

// The file must be readable: OpenSSL's own error for a missing file is a bare error code.
void check_readable(const std::string& path, const char* what) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument(std::string("TLS ") + what + " " + path + ": cannot read: " + detail::errno_text(errno));
}

// The client's TLS context for `options` (tcp:// with TLS): the CA, the client certificate
// and key loaded (each checked here, so a bad file fails the Client's constructor, named),
// peer verification on, and the engine's certificate required to name the address's host.
Poco::Net::Context::Ptr make_tls_context(const ClientOptions& options) {
    const TlsOptions& tls = *options.tls;
    if (options.address.kind != EngineAddress::Kind::Tcp) {
        throw std::invalid_argument("TLS is for tcp:// engines; " + options.address.to_string() + " is a unix socket");
    }
    if (tls.ca_file.empty()) throw std::invalid_argument("TLS needs a CA file (ca.pem) to verify the engine with");
    if (tls.cert_file.empty() != tls.key_file.empty()) {
        throw std::invalid_argument(tls.cert_file.empty() ? "TLS key file " + tls.key_file + " has no certificate file (cert.pem)"
                                                          : "TLS certificate file " + tls.cert_file + " has no key file (key.pem)");
    }
    check_readable(tls.ca_file, "CA file");
    if (!tls.cert_file.empty()) {
        check_readable(tls.cert_file, "certificate file");
        check_readable(tls.key_file, "key file");
    }
    Poco::Net::Context::Params params;
    params.caLocation = tls.ca_file;
    params.certificateFile = tls.cert_file;
    params.privateKeyFile = tls.key_file;
    params.verificationMode = Poco::Net::Context::VERIFY_RELAXED;  // for a client: verify the peer
    params.cipherList = "DEFAULT";  // OpenSSL's vetted defaults, not Poco's "ALL:..."
    Poco::Net::Context::Ptr context;
    try {
        context = new Poco::Net::Context(Poco::Net::Context::TLS_CLIENT_USE, params);
    } catch (const Poco::Exception& e) {
        throw std::invalid_argument("TLS files: " + e.displayText());
    }
    SSL_CTX* ssl = context->sslContext();
    // OpenSSL drops a key that does not match the certificate without a word.
    if (!tls.cert_file.empty() && SSL_CTX_check_private_key(ssl) != 1) {
        throw std::invalid_argument("TLS key file " + tls.key_file + " is not the key of the certificate " + tls.cert_file);
    }
    // TLS 1.2 at least, as the docker CLI asks.
    context->requireMinimumProtocol(Poco::Net::Context::PROTO_TLSV1_2);
    // The host check is OpenSSL's, inside the handshake: an IP address must be in the
    // certificate's subjectAltName, a name in its DNS names (never its CN), as Go's check
    // the docker CLI uses. Poco's own check after the handshake is off: it would resolve the
    // certificate's names over DNS, and it skips loopback hosts.
    X509_VERIFY_PARAM* verify = SSL_CTX_get0_param(ssl);
    const std::string& host = options.address.host;
    if (X509_VERIFY_PARAM_set1_ip_asc(verify, host.c_str()) != 1) {
        X509_VERIFY_PARAM_set_hostflags(verify, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT | X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (X509_VERIFY_PARAM_set1_host(verify, host.c_str(), host.size()) != 1) {
            throw std::invalid_argument("TLS: cannot verify certificates for the host name " + host);
        }
    }
    context->enableExtendedCertificateVerification(false);
    context->setInvalidCertificateHandler(new RecordCertificateProblem);
    return context;
}

// The engine's answer to a request whose /vX.Y prefix it does not serve: Docker's
// middleware answers 400 "client version 1.43 is too old. Minimum supported API version is
// 1.44, ..." or "client version 1.53 is too new. Maximum supported API version is 1.52".
bool is_version_refusal(int status, const std::string& message) {
    return status == 400 && message.rfind("client version ", 0) == 0 &&
           (message.find("too old") != std::string::npos || message.find("too new") != std::string::npos);
}

// A kept-alive connection that is readable while idle has been closed by the engine (EOF) or
// holds bytes nobody asked for: either way it must not carry a request.
bool idle_connection_is_stale(Poco::Net::StreamSocket& socket) {
    try {
        return socket.poll(Poco::Timespan(0), Poco::Net::Socket::SELECT_READ | Poco::Net::Socket::SELECT_ERROR);
    } catch (const Poco::Exception&) {
        return true;
    }
}

// The status Docker gives the answer that Podman 4 gives as a 500 with libpod's cause last:
// a container in the wrong state (a plain delete of a running one, a kill of a stopped one)
// is Docker's 409, one that went away meanwhile Docker's 404.
int docker_status_of(int status, const std::string& message) {
    if (status != 500) return status;
    if (message.ends_with(": container state improper")) return 409;
    if (message.ends_with(": no such container")) return 404;
    // A delete that waited on the container's lock while another delete removed it:
    // libpod's ErrCtrRemoved. Podman's compat DELETE answers only 404 (ErrNoSuchCtr) or 500,
    // never Docker's 409 "removal ... already in progress": the second delete finds it gone.
    if (message.ends_with("container has already been removed")) return 404;
    // Networks and volumes: libpod's ErrNoSuchNetwork/ErrNoSuchVolume, ErrNetworkInUse and
    // ErrVolumeBeingUsed.
    if (message.ends_with(": no such network") || message.ends_with(": no such volume")) return 404;
    if (message.ends_with(": network is being used") || message.ends_with(": volume is being used")) return 409;
    return status;
}

std::string engine_message_of(const std::string& body) {
    try {
        Poco::JSON::Parser parser;
        auto object = parser.parse(body).extract<Object::Ptr>();
        if (object && object->has("message")) return object->getValue<std::string>("message");
    } catch (...) {
        // Not JSON: the raw text is the best message there is.
    }
    std::string text = body.substr(0, 512);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return text;
}

// Parses `body` as JSON of type T (Object::Ptr or Array::Ptr); anything else is the
// engine's protocol error, named after the request `what`.
template <typename T>
T parse_json(const std::string& body, const std::string& what, const char* expected) {
    Poco::Dynamic::Var result;
    try {
        Poco::JSON::Parser parser;
        result = parser.parse(body);
    } catch (const Poco::Exception& e) {
        throw ProtocolError(0, "", what + ": unparseable JSON from the engine: " + e.displayText());
    }
    if (result.type() != typeid(T)) throw ProtocolError(0, "", what + ": expected " + expected + " from the engine");
    auto value = result.extract<T>();
    if (!value) throw ProtocolError(0, "", what + ": expected " + expected + " from the engine");
    return value;
}

Object::Ptr parse_object(const std::string& body, const std::string& what) {
    return parse_json<Object::Ptr>(body, what, "a JSON object");
}

Array::Ptr parse_array(const std::string& body, const std::string& what) {
    return parse_json<Array::Ptr>(body, what, "a JSON array");
}

std::string str(const Object::Ptr& o, const std::string& key) {
    if (!o || !o->has(key) || o->isNull(key)) return {};
    try {
        return o->getValue<std::string>(key);
    } catch (...) {
        return o->get(key).toString();
    }
}

template <typename T>
T num(const Object::Ptr& o, const std::string& key) {
    if (!o || !o->has(key) || o->isNull(key)) return T{};
    try {
        return o->getValue<T>(key);
    } catch (...) {
        return T{};
    }
}

bool boolean(const Object::Ptr& o, const std::string& key) {
    if (!o || !o->has(key) || o->isNull(key)) return false;
    try {
        return o->getValue<bool>(key);
    } catch (...) {
        return false;
    }
}

std::map<std::string, std::string> string_map(const Object::Ptr& o) {
    std::map<std::string, std::string> out;
    if (!o) return out;
    for (const auto& [key, value] : *o) {
        out[key] = value.isEmpty() ? std::string{} : value.toString();
    }
    return out;
}

Array::Ptr string_array(const std::vector<std::string>& values) {
    Array::Ptr array = new Array;
    for (const auto& v : values) array->add(v);
    return array;
}

std::string stringify(const Object& object) {
    std::ostringstream out;
    object.stringify(out);
    return out.str();
}

}  // namespace

Event parse_event_line(const std::string& line) {
    auto object = parse_object(line, "event");
    Event event;
    event.type = str(object, "Type");
    event.action = str(object, "Action");
    event.time_nano = num<std::int64_t>(object, "timeNano");
    auto actor = object->getObject("Actor");
    if (actor) {
        event.id = str(actor, "ID");
        event.attributes = string_map(actor->getObject("Attributes"));
    }
    return event;
}

// ---- the client -------------------------------------------------------------------------

class HttpEventStream;

struct Client::Impl : std::enable_shared_from_this<Client::Impl> {
    explicit Impl(ClientOptions o) : options(std::move(o)) {
        check_plain_tcp(options);
        if (options.tls) tls_context = make_tls_context(options);
    }

    ClientOptions options;
    Poco::Net::Context::Ptr tls_context;  // null: plain
    mutable std::mutex mutex;
    bool closed = false;
    std::vector<std::unique_ptr<Connection>> idle;
    std::set<Connection*> busy;
    std::set<HttpEventStream*> streams;
    // The API version in use; "" until negotiated. Cleared when a negotiation fails or the
    // engine refuses the version, so the next call asks the engine again.
    std::mutex version_mutex;
    std::string negotiated_version;
    // Set when a connect fails: the engine that comes back may be another version. A flag,
    // not a clear, because connect() also runs inside a negotiation holding version_mutex.
    std::atomic<bool> engine_lost{false};
    // Whether the engine that last answered is Podman: its every answer names the libpod API
    // it also serves (Libpod-Api-Version). Read by remove(), whose force differs there.
    std::atomic<bool> engine_is_podman{false};

    struct Response {
        int status = 0;
        std::string body;
        std::string api_version_header;  // API-Version, "" when the engine sent none
    };

    std::unique_ptr<Connection> connect() {
        auto connection = std::make_unique<Connection>();
        const auto& address = options.address;
        try {
            Poco::Net::SocketAddress socket_address =
                address.kind == EngineAddress::Kind::Unix
                    ? Poco::Net::SocketAddress(Poco::Net::SocketAddress::UNIX_LOCAL, address.path)
                    : Poco::Net::SocketAddress(address.host, address.port);
            const Poco::Timespan timeout(options.connect_timeout.count() * 1000);
            if (tls_context) {
                // Connects, then shakes hands within the same timeout.
                Poco::Net::SecureStreamSocket secure(tls_context);
                // SNI for a name; an IP address is not sent (RFC 6066).
                if (Poco::Net::IPAddress ip; !Poco::Net::IPAddress::tryParse(address.host, ip))
                    secure.setPeerHostName(address.host);
                certificate_problem.clear();
                secure.connect(socket_address, timeout);
                connection->socket = secure;
            } else {
                connection->socket.connect(socket_address, timeout);
            }
        } catch (const Poco::TimeoutException& e) {
            engine_lost = true;
            throw Timeout(0, "", "connecting to the engine at " + address.to_string() + " timed out");
        } catch (const Poco::Net::SSLException& e) {
            engine_lost = true;
            throw Unreachable(0, "", "TLS handshake with the engine at " + address.to_string() + " failed: " +
                                         (certificate_problem.empty()
                                              ? e.displayText()
                                              : "its certificate was not accepted: " + certificate_problem));
        } catch (const Poco::Exception& e) {
            engine_lost = true;
            throw Unreachable(0, "", "cannot connect to the engine at " + address.to_string() + ": " +
                                         e.displayText());
        }
        // Poco cannot connect an HTTPClientSession to a unix address itself, so we hand it a
        // connected socket; keep-alive must then be switched on explicitly.
        connection->http = std::make_unique<Poco::Net::HTTPClientSession>(connection->socket);
        connection->http->setKeepAlive(true);
        return connection;
    }

    // Takes an idle connection or opens a new one, and registers it as busy so close() can
    // shut it down under a blocked caller.
    std::unique_ptr<Connection> borrow() {
        {
            std::lock_guard lock(mutex);
            if (closed) throw ClientClosed(0, "", "the engine client is closed");
            while (!idle.empty()) {
                auto connection = std::move(idle.back());
                idle.pop_back();
                if (idle_connection_is_stale(connection->socket)) continue;
                connection->reused = true;
                busy.insert(connection.get());
                return connection;
            }
        }
        auto connection = connect();
        std::lock_guard lock(mutex);
        if (closed) throw ClientClosed(0, "", "the engine client is closed");
        busy.insert(connection.get());
        return connection;
    }

    void give_back(std::unique_ptr<Connection> connection, bool reusable) {
        std::lock_guard lock(mutex);
        busy.erase(connection.get());
        if (reusable && !closed && idle.size() < options.max_idle_connections) {
            idle.push_back(std::move(connection));
        }
        // Otherwise the unique_ptr closes the socket here, under the lock, so close() never
        // sees a half-destroyed connection.
    }

    bool is_closed() const {
        std::lock_guard lock(mutex);
        return closed;
    }

    [[noreturn]] void rethrow_io_error(const std::string& what) {
        if (is_closed()) throw ClientClosed(0, "", what + ": the engine client was closed");
        try {
            throw;
        } catch (const EngineError&) {
            throw;
        } catch (const Poco::TimeoutException& e) {
            throw Timeout(0, "", what + ": no answer from the engine within the timeout");
        } catch (const Poco::Net::MessageException& e) {
            throw ProtocolError(0, "", what + ": malformed HTTP from the engine: " + e.displayText());
        } catch (const Poco::Net::SSLException& e) {
            // After a TLS 1.3 handshake the engine checks our certificate and answers with an
            // alert ("bad certificate", "unknown ca"), seen on the first read.
            const bool no_certificate = options.tls && options.tls->cert_file.empty();
            throw Unreachable(0, "", what + ": TLS with the engine failed: " + e.displayText() +
                                         (no_certificate ? " (this client shows no certificate, which an engine "
                                                           "run with --tlsverify requires: cert.pem, key.pem)"
                                                         : ""));
        } catch (const Poco::Exception& e) {
            throw Unreachable(0, "", what + ": connection to the engine failed: " + e.displayText());
        } catch (const std::exception& e) {
            throw Unreachable(0, "", what + ": connection to the engine failed: " + e.what());
        }
    }

    std::string api_version() {
        std::lock_guard lock(version_mutex);
        if (engine_lost.exchange(false)) negotiated_version.clear();
        if (negotiated_version.empty()) negotiated_version = negotiate();
        return negotiated_version;
    }

    // Drops `version` after the engine refused it, so the next call negotiates again.
    void forget_api_version(const std::string& version) {
        std::lock_guard lock(version_mutex);
        if (negotiated_version == version) negotiated_version.clear();
    }

    // Settles on /_ping's API-Version header, as Docker's own clients do, when that alone
    // decides: the engine's newest version within this client's range is the answer whatever
    // the engine's floor, which is never above its newest. Podman 4.3 answers /_ping in under
    // 1 ms and /version in ~0.4 s idle, longer behind a busy engine: a reaperd starting beside
    // a runaway log let it grow by that much more before its first cut (issue 21 point 6).
    // GET /version decides the rest: a pinned version (checked against the engine's floor),
    // an engine newer than this client (its floor may be above our ceiling) or older, and an
    // engine that names no version in /_ping.
    std::string negotiate() {
        if (options.pinned_api_version.empty()) {
            auto ping = send("GET", "/_ping", "", "", options.request_timeout);
            const std::string& engine_max = ping.api_version_header;
            if (ping.status == 200 && is_api_version(engine_max) &&
                compare_api_versions(engine_max, options.max_api_version) <= 0 &&
                compare_api_versions(engine_max, options.min_api_version) >= 0)
                return engine_max;
        }
        auto response = send("GET", "/version", "", "", options.request_timeout);
        if (response.status != 200) {
            throw_engine_error(error_kind_for_status(response.status), response.status,
                               engine_message_of(response.body), "GET /version: HTTP " +
                               std::to_string(response.status));
        }
        auto object = parse_object(response.body, "GET /version");
        std::string engine_max = str(object, "ApiVersion");
        std::string engine_min = str(object, "MinAPIVersion");
        if (engine_max.empty()) throw ProtocolError(200, "", "GET /version: the engine named no ApiVersion");
        std::string engine = str(object, "Version");
        std::string engine_range = "the engine" + (engine.empty() ? "" : " (version " + engine + ")") +
                                   " speaks API " + (engine_min.empty() ? "up to " : engine_min + " to ") +
                                   engine_max;
        auto below_engine_min = [&](const std::string& v) {
            return !engine_min.empty() && compare_api_versions(v, engine_min) < 0;
        };
        if (!options.pinned_api_version.empty()) {
            const auto& pinned = options.pinned_api_version;
            if (below_engine_min(pinned) || compare_api_versions(pinned, engine_max) > 0) {
                throw UnsupportedVersion(200, "", "API version " + pinned + " is pinned (DOCKER_API_VERSION), but " +
                                                      engine_range);
            }
            return pinned;
        }
        std::string version = compare_api_versions(engine_max, options.max_api_version) < 0
                                  ? engine_max
                                  : options.max_api_version;
        if (compare_api_versions(version, options.min_api_version) < 0 || below_engine_min(version)) {
            throw UnsupportedVersion(200, "", engine_range + "; this client speaks API " + options.min_api_version +
                                                  " to " + options.max_api_version);
        }
        return version;
    }

    // One HTTP exchange with the whole response body read. Only a GET or HEAD is ever sent
    // twice: one that failed before any answer on a reused keep-alive connection (the engine
    // closed it between our staleness check and the write; not a timeout) goes again on a
    // fresh one. Any
    // other request may have reached the engine, and a second POST /containers/create would
    // make a second container; its failure goes to the caller.
    Response send(const std::string& method, const std::string& path, const std::string& body,
                  const std::string& content_type, std::chrono::milliseconds timeout) {
        for (int attempt = 0;; ++attempt) {
            auto connection = borrow();
            bool answered = false;
            try {
                auto t = Poco::Timespan(timeout.count() * 1000);
                connection->socket.setReceiveTimeout(t);
                connection->socket.setSendTimeout(t);
                HTTPRequest request(method, path, HTTPRequest::HTTP_1_1);
                request.setHost("docker");  // the engine requires a Host header, any name
                request.setKeepAlive(true);
                request.setContentLength(static_cast<std::streamsize>(body.size()));
                if (!content_type.empty()) request.setContentType(content_type);
                auto& out = connection->http->sendRequest(request);
                out.write(body.data(), static_cast<std::streamsize>(body.size()));
                out.flush();
                HTTPResponse response;
                auto& in = connection->http->receiveResponse(response);
                answered = true;
                Response result;
                result.status = static_cast<int>(response.getStatus());
                result.api_version_header = response.get("API-Version", "");
                engine_is_podman = response.has("Libpod-Api-Version");
                // The engine sends some headers early (wait, for one), so a timeout or a
                // close() can strike inside the body: let the stream rethrow the cause.
                in.exceptions(std::ios::badbit);
                Poco::StreamCopier::copyToString(in, result.body);
                // Poco reports a connection closed before Content-Length bytes as a plain end.
                if (response.hasContentLength() && !response.getChunkedTransferEncoding() &&
                    static_cast<std::streamsize>(result.body.size()) < response.getContentLength()) {
                    throw Poco::IOException("the engine closed the connection after " +
                                            std::to_string(result.body.size()) + " of " +
                                            std::to_string(response.getContentLength()) + " bytes");
                }
                if (is_closed()) throw ClientClosed(0, "", method + " " + path + ": the engine client was closed");
                give_back(std::move(connection), response.getKeepAlive());
                return result;
            } catch (...) {
                // A timeout is the engine not answering, not a stale connection: sent again,
                // a GET would wait twice the request timeout on a stalled engine (issue 23).
                bool timed_out = false;
                try {
                    throw;
                } catch (const Poco::TimeoutException&) {
                    timed_out = true;
                } catch (...) {
                }
                bool resend = connection->reused && !answered && !timed_out && attempt == 0 &&
                              (method == "GET" || method == "HEAD");
                give_back(std::move(connection), false);
                if (resend && !is_closed()) continue;
                rethrow_io_error(method + " " + path);
            }
        }
    }

    // A versioned call that expects one of `ok` statuses; any other becomes a typed error.
    // An engine that refuses the negotiated version (it was upgraded or downgraded since) did
    // not act on the request, so it is sent once more under a freshly negotiated version.
    Response call(const std::string& method, const std::string& path, const std::string& body = "",
                  std::initializer_list<int> ok = {200, 201, 204},
                  std::optional<std::chrono::milliseconds> timeout = std::nullopt,
                  const std::string& content_type = "application/json") {
        for (int attempt = 0;; ++attempt) {
            auto version = api_version();
            auto response = send(method, "/v" + version + path, body, body.empty() ? "" : content_type,
                                 timeout.value_or(options.request_timeout));
            for (int s : ok) {
                if (response.status == s) return response;
            }
            auto message = engine_message_of(response.body);
            if (is_version_refusal(response.status, message)) {
                forget_api_version(version);
                if (attempt == 0 && options.pinned_api_version.empty() && api_version() != version) continue;
            }
            throw_error_for(response.status, message, method + " " + path);
        }
    }

    // The typed error for an answer of `status`; a version refusal is UnsupportedVersion.
    [[noreturn]] static void throw_error_for(int status, const std::string& message, const std::string& what) {
        auto kind = is_version_refusal(status, message) ? EngineErrorKind::Unsupported
                                                        : error_kind_for_status(docker_status_of(status, message));
        throw_engine_error(kind, status, message,
                           what + ": HTTP " + std::to_string(status) + (message.empty() ? "" : ": " + message));
    }

    void close();
};

// An events stream on a connection of its own, registered with its client so that the
// client's close() ends it.
class HttpEventStream final : public EventStream {
public:
    HttpEventStream(std::shared_ptr<Client::Impl> client, std::unique_ptr<Connection> connection,
                    bool ends_by_itself, std::string what)
        : client_(std::move(client)), connection_(std::move(connection)),
          ends_by_itself_(ends_by_itself), what_(std::move(what)) {}

    ~HttpEventStream() override {
        std::lock_guard lock(client_->mutex);
        client_->streams.erase(this);
        connection_.reset();
    }

    // Sends GET /v<version><path>.
    void begin(const std::string& version, const std::string& path) {
        version_ = version;
        try {
            connection_->socket.setReceiveTimeout(Poco::Timespan(client_->options.request_timeout.count() * 1000));
            HTTPRequest request(HTTPRequest::HTTP_GET, "/v" + version + path, HTTPRequest::HTTP_1_1);
            request.setHost("docker");
            request.setContentLength(0);
            connection_->http->sendRequest(request).flush();
            HTTPResponse response;
            in_ = &connection_->http->receiveResponse(response);
            if (response.getStatus() != HTTPResponse::HTTP_OK) {
                std::string body;
                Poco::StreamCopier::copyToString(*in_, body);
                auto message = engine_message_of(body);
                if (is_version_refusal(response.getStatus(), message)) client_->forget_api_version(version_);
                Client::Impl::throw_error_for(response.getStatus(), message, what_);
            }
            // Events arrive when they happen; only cancel() or the engine ends a read.
            connection_->socket.setReceiveTimeout(Poco::Timespan(0));
        } catch (...) {
            client_->rethrow_io_error(what_);
        }
    }

    std::optional<Event> next() override {
        std::string line;
        for (;;) {
            if (cancelled_) return std::nullopt;
            bool got = false;
            try {
                got = static_cast<bool>(std::getline(*in_, line));
            } catch (...) {
                if (cancelled_) return std::nullopt;
                client_->rethrow_io_error(what_);
            }
            if (cancelled_) return std::nullopt;
            if (!got) {
                if (ends_by_itself_ && in_->eof() && line.empty()) return std::nullopt;
                if (client_->is_closed()) throw ClientClosed(0, "", what_ + ": the engine client was closed");
                if (!line.empty()) {
                    throw ProtocolError(0, "", what_ + ": the stream ended inside an event: " + line.substr(0, 200));
                }
                throw Unreachable(0, "", what_ + ": the engine ended the event stream");
            }
            // A last line without its newline was cut short by the end of the stream.
            if (in_->eof()) throw ProtocolError(0, "", what_ + ": the stream ended inside an event: " + line.substr(0, 200));
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.empty()) continue;
            return parse_event_line(line);
        }
    }

    void cancel() noexcept override {
        cancelled_ = true;
        interrupt(connection_->socket);
    }

private:
    std::shared_ptr<Client::Impl> client_;
    std::unique_ptr<Connection> connection_;
    std::istream* in_ = nullptr;
    bool ends_by_itself_;
    std::string what_;
    std::string version_;
    std::atomic<bool> cancelled_{false};
};

void Client::Impl::close() {
    std::lock_guard lock(mutex);
    if (closed) return;
    closed = true;
    idle.clear();
    // The caller holding each sees its call fail and drops the connection.
    for (auto* connection : busy) interrupt(connection->socket);
    for (auto* stream : streams) stream->cancel();
}

Client::Client(ClientOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

Client::~Client() { close(); }

void Client::close() noexcept { impl_->close(); }

const ClientOptions& Client::options() const noexcept { return impl_->options; }

std::string Client::api_version() { return impl_->api_version(); }

std::size_t Client::open_connections() const {
    std::lock_guard lock(impl_->mutex);
    return impl_->idle.size() + impl_->busy.size() + impl_->streams.size();
}

void Client::ping() {
    auto response = impl_->send("GET", "/_ping", "", "", impl_->options.request_timeout);
    if (response.status != 200) {
        auto message = engine_message_of(response.body);
        throw_engine_error(error_kind_for_status(response.status), response.status, message,
                           "GET /_ping: HTTP " + std::to_string(response.status));
    }
}

VersionInfo Client::version() {
    auto object = parse_object(impl_->call("GET", "/version").body, "GET /version");
    VersionInfo info;
    info.version = str(object, "Version");
    info.api_version = str(object, "ApiVersion");
    info.min_api_version = str(object, "MinAPIVersion");
    info.os = str(object, "Os");
    info.arch = str(object, "Arch");
    return info;
}

EngineInfo Client::info() {
    auto object = parse_object(impl_->call("GET", "/info").body, "GET /info");
    EngineInfo info;
    info.docker_root_dir = str(object, "DockerRootDir");
    return info;
}

std::vector<ContainerSummary> Client::list_containers(const ListOptions& options) {
    std::string path = "/containers/json?all=" + std::string(options.all ? "1" : "0");
    if (!options.filters.empty()) path += "&filters=" + url_encode(encode_filters(options.filters));
    auto array = parse_array(impl_->call("GET", path).body, "GET /containers/json");
    std::vector<ContainerSummary> result;
    result.reserve(array->size());
    for (std::size_t i = 0; i < array->size(); ++i) {
        auto o = array->getObject(static_cast<unsigned>(i));
        if (!o) throw ProtocolError(200, "", "GET /containers/json: an entry is not an object");
        ContainerSummary c;
        c.id = str(o, "Id");
        if (auto names = o->getArray("Names")) {
            for (std::size_t n = 0; n < names->size(); ++n) {
                auto name = names->getElement<std::string>(static_cast<unsigned>(n));
                if (!name.empty() && name.front() == '/') name.erase(0, 1);
                c.names.push_back(name);
            }
        }
        c.image = str(o, "Image");
        c.labels = string_map(o->getObject("Labels"));
        c.state = str(o, "State");
        c.status = str(o, "Status");
        c.created_unix_s = num<std::int64_t>(o, "Created");
        result.push_back(std::move(c));
    }
    return result;
}

ContainerInfo Client::inspect(const std::string& id) {
    auto o = parse_object(impl_->call("GET", "/containers/" + url_encode(id) + "/json").body,
                          "GET /containers/" + id + "/json");
    ContainerInfo info;
    info.id = str(o, "Id");
    info.name = str(o, "Name");
    if (!info.name.empty() && info.name.front() == '/') info.name.erase(0, 1);
    info.image = str(o, "Image");
    info.created = str(o, "Created");
    info.log_path = str(o, "LogPath");
    if (auto config = o->getObject("Config")) {
        info.labels = string_map(config->getObject("Labels"));
        info.has_healthcheck = config->has("Healthcheck") && !config->isNull("Healthcheck");
        if (info.has_healthcheck) {
            auto test = config->getObject("Healthcheck")->getArray("Test");
            info.has_healthcheck = test && test->size() > 0 && test->getElement<std::string>(0) != "NONE";
        }
    }
    if (auto state = o->getObject("State")) {
        auto& s = info.state;
        s.status = str(state, "Status");
        s.running = boolean(state, "Running");
        s.paused = boolean(state, "Paused");
        s.restarting = boolean(state, "Restarting");
        s.dead = boolean(state, "Dead");
        s.pid = num<int>(state, "Pid");
        s.exit_code = num<int>(state, "ExitCode");
        s.error = str(state, "Error");
        s.started_at = str(state, "StartedAt");
        s.finished_at = str(state, "FinishedAt");
        if (auto health = state->getObject("Health")) s.health_status = str(health, "Status");
    }
    if (auto host = o->getObject("HostConfig")) {
        info.auto_remove = boolean(host, "AutoRemove");
        if (auto log = host->getObject("LogConfig")) {
            info.log_driver = str(log, "Type");
            info.log_options = string_map(log->getObject("Config"));
        }
    }
    return info;
}

std::string Client::create(const ContainerSpec& spec) {
    Object body;
    body.set("Image", spec.image);
    if (!spec.cmd.empty()) body.set("Cmd", string_array(spec.cmd));
    if (!spec.entrypoint.empty()) body.set("Entrypoint", string_array(spec.entrypoint));
    if (!spec.env.empty()) body.set("Env", string_array(spec.env));
    Object::Ptr labels = new Object;
    for (const auto& [k, v] : spec.labels) labels->set(k, v);
    body.set("Labels", labels);
    if (!spec.healthcheck_cmd.empty()) {
        Object::Ptr health = new Object;
        auto test = string_array(spec.healthcheck_cmd);
        Array::Ptr full = new Array;
        full->add("CMD");
        for (std::size_t i = 0; i < test->size(); ++i) full->add(test->get(static_cast<unsigned>(i)));
        health->set("Test", full);
        if (spec.healthcheck_interval.count() > 0) {
            health->set("Interval", static_cast<std::int64_t>(spec.healthcheck_interval.count()) * 1'000'000);
        }
        body.set("Healthcheck", health);
    }
    Object::Ptr host = new Object;
    host->set("NetworkMode", spec.network_mode);
    host->set("AutoRemove", spec.auto_remove);
    if (spec.memory_bytes > 0) host->set("Memory", spec.memory_bytes);
    if (spec.nano_cpus > 0) host->set("NanoCpus", spec.nano_cpus);
    if (spec.pids_limit > 0) host->set("PidsLimit", spec.pids_limit);
    if (!spec.log_config.type.empty() || !spec.log_config.options.empty()) {
        Object::Ptr log = new Object;
        log->set("Type", spec.log_config.type);
        Object::Ptr config = new Object;
        for (const auto& [k, v] : spec.log_config.options) config->set(k, v);
        log->set("Config", config);
        host->set("LogConfig", log);
    }
    body.set("HostConfig", host);
    std::string path = "/containers/create";
    if (!spec.name.empty()) path += "?name=" + url_encode(spec.name);
    auto o = parse_object(impl_->call("POST", path, stringify(body), {201}).body, "POST /containers/create");
    auto id = str(o, "Id");
    if (id.empty()) throw ProtocolError(201, "", "POST /containers/create: the engine returned no Id");
    return id;
}

void Client::start(const std::string& id) {
    impl_->call("POST", "/containers/" + url_encode(id) + "/start", "", {204, 304});
}

void Client::stop(const std::string& id, std::chrono::seconds grace) {
    impl_->call("POST", "/containers/" + url_encode(id) + "/stop?t=" + std::to_string(grace.count()), "",
                {204, 304}, impl_->options.request_timeout + grace);
}

void Client::kill(const std::string& id, const std::string& signal) {
    impl_->call("POST", "/containers/" + url_encode(id) + "/kill?signal=" + url_encode(signal), "", {204});
}

void Client::remove(const std::string& id, const RemoveOptions& options) {
    const std::string volumes = options.volumes ? "true" : "false";
    // Docker's force kills at once. Podman's compat DELETE stops first, waiting the
    // container's stop timeout (10 s for one its CLI made, or any on Podman 5, where
    // compat-made ones get 10 s too; 0 on Podman 4.3): measured 10.1 s against 0.1-0.2 s.
    // Its own libpod DELETE takes that wait as `timeout`, and answers in the same dialect
    // (404, or 500 with libpod's cause), with 200 and the removed ids.
    api_version();  // negotiated first: its answer says which engine this is
    if (options.force && impl_->engine_is_podman) {
        impl_->call("DELETE", "/libpod/containers/" + url_encode(id) + "?force=true&timeout=0&volumes=" + volumes, "",
                    {200});
        return;
    }
    impl_->call("DELETE",
                "/containers/" + url_encode(id) + "?force=" + (options.force ? "true" : "false") + "&v=" + volumes,
                "", {204});
}

int Client::wait(const std::string& id, std::chrono::milliseconds timeout) {
    auto o = parse_object(impl_->call("POST", "/containers/" + url_encode(id) + "/wait", "", {200}, timeout).body,
                          "POST /containers/" + id + "/wait");
    // A wait that failed answers 200 with StatusCode -1 and the reason in Error.Message.
    if (auto error = o->getObject("Error")) {
        if (auto message = str(error, "Message"); !message.empty())
            throw ServerError(200, message, "POST /containers/" + id + "/wait: " + message);
    }
    return num<int>(o, "StatusCode");
}

int Client::exec(const std::string& id, const std::vector<std::string>& cmd, std::chrono::milliseconds timeout) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout;
    auto did_not_finish = [&] {
        return Timeout(0, "", "exec in " + id + " did not finish within " + std::to_string(timeout.count()) + " ms");
    };
    auto time_left = [&] {
        auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
        return Poco::Timespan(left.count() > 1000 ? left.count() : 1000);  // Poco takes 0 as "no limit"
    };
    // Attached, on both engines: the start's answer is the command's output, which ends when
    // the command ends. A detached exec would have to be polled, and Podman 4.3 reports a
    // detached one Running for ever; with nothing attached, Docker ends the start at once.
    Object body;
    body.set("Cmd", string_array(cmd));
    body.set("AttachStdout", true);
    body.set("AttachStderr", true);
    auto created = parse_object(impl_->call("POST", "/containers/" + url_encode(id) + "/exec", stringify(body), {201}).body,
                                "POST /containers/" + id + "/exec");
    const std::string exec_path = "/exec/" + url_encode(str(created, "Id"));
    const std::string start_path = exec_path + "/start";
    const std::string start_body = R"({"Detach":false,"Tty":false})";
    const std::string version = impl_->api_version();
    // The engine answers 200 and then takes the connection over: the output follows, framed
    // by neither a length nor chunks, until the engine closes it. It is read and dropped, each
    // read bounded by the time left, so neither a silent nor an endless command outlasts
    // `timeout`.
    auto connection = impl_->borrow();
    try {
        connection->socket.setSendTimeout(time_left());
        connection->socket.setReceiveTimeout(time_left());
        HTTPRequest request(HTTPRequest::HTTP_POST, "/v" + version + start_path, HTTPRequest::HTTP_1_1);
        request.setHost("docker");
        request.setContentType("application/json");
        request.setContentLength(static_cast<std::streamsize>(start_body.size()));
        connection->http->sendRequest(request) << start_body << std::flush;
        HTTPResponse response;
        auto& in = connection->http->receiveResponse(response);
        if (response.getStatus() != HTTPResponse::HTTP_OK) {
            std::string text;
            Poco::StreamCopier::copyToString(in, text);
            Impl::throw_error_for(response.getStatus(), engine_message_of(text), "POST " + start_path);
        }
        in.exceptions(std::ios::badbit);  // a failed read rethrows its cause
        char dropped[16 * 1024];
        while (in.get() != std::char_traits<char>::eof()) {  // one socket read at a time
            in.readsome(dropped, sizeof dropped);
            if (Clock::now() >= deadline) throw did_not_finish();
            connection->socket.setReceiveTimeout(time_left());
        }
    } catch (const Poco::TimeoutException&) {
        impl_->give_back(std::move(connection), false);
        if (impl_->is_closed()) throw ClientClosed(0, "", "POST " + start_path + ": the engine client was closed");
        throw did_not_finish();
    } catch (...) {
        impl_->give_back(std::move(connection), false);
        impl_->rethrow_io_error("POST " + start_path);
    }
    impl_->give_back(std::move(connection), false);  // the engine closed it
    // The output can close a moment before the engine has the exit code.
    const std::string inspect_path = exec_path + "/json";
    for (;;) {
        auto o = parse_object(impl_->call("GET", inspect_path).body, "GET " + inspect_path);
        if (!boolean(o, "Running") && !o->isNull("ExitCode") && o->has("ExitCode")) return num<int>(o, "ExitCode");
        if (Clock::now() >= deadline) throw did_not_finish();
        std::this_thread::sleep_for(std::chrono::milliseconds{20});
    }
}

void Client::import_image(std::istream& tar, const std::string& reference) {
    // The tag goes inside `repo` ("name:tag"), as the docker CLI sends it: Docker takes the
    // tag from either place, Podman 4.3 ignores a separate `tag=` and names the image :latest.
    std::string repo = reference;
    auto colon = reference.rfind(':');
    if (colon == std::string::npos || reference.find('/', colon) != std::string::npos) repo += ":latest";
    std::string body((std::istreambuf_iterator<char>(tar)), std::istreambuf_iterator<char>());
    auto response = impl_->call("POST", "/images/create?fromSrc=-&repo=" + url_encode(repo), body, {200}, std::nullopt,
                                "application/x-tar");
    // Import reports failures inside a 200 progress stream, one JSON object per line: in
    // "errorDetail": {"message"}, and until API 1.48 also in "error", which later engines may
    // leave out (deprecated in 1.48's swagger).
    std::istringstream lines(response.body);
    for (std::string line; std::getline(lines, line);) {
        if (line.find("\"error") == std::string::npos) continue;
        auto o = parse_object(line, "POST /images/create");
        std::string message;
        if (auto detail = o->getObject("errorDetail")) message = str(detail, "message");
        if (message.empty()) message = str(o, "error");
        if (message.empty()) continue;
        throw ServerError(200, message, "POST /images/create: " + message);
    }
}

std::unique_ptr<EventStream> Client::events(const EventsOptions& options) {
    std::string query;
    auto add = [&query](const std::string& kv) { query += (query.empty() ? "?" : "&") + kv; };
    if (!options.filters.empty()) add("filters=" + url_encode(encode_filters(options.filters)));
    if (options.since) add("since=" + std::to_string(*options.since));
    if (options.until) add("until=" + std::to_string(*options.until));
    for (int attempt = 0;; ++attempt) {
        auto version = impl_->api_version();
        auto connection = impl_->connect();
        auto stream = std::make_unique<HttpEventStream>(impl_, std::move(connection), options.until.has_value(),
                                                        "GET /events");
        {
            std::lock_guard lock(impl_->mutex);
            if (impl_->closed) throw ClientClosed(0, "", "the engine client is closed");
            impl_->streams.insert(stream.get());
        }
        try {
            stream->begin(version, "/events" + query);
            return stream;
        } catch (const UnsupportedVersion&) {
            // As in call(): the engine changed version under us; once more, renegotiated.
            if (attempt > 0 || !impl_->options.pinned_api_version.empty() || impl_->api_version() == version) throw;
        }
    }
}

// ---- networks and volumes ---------------------------------------------------------------

namespace {

NetworkInfo network_of(const Object::Ptr& o) {
    NetworkInfo n;
    n.id = str(o, "Id");
    n.name = str(o, "Name");
    n.driver = str(o, "Driver");
    n.created = str(o, "Created");
    n.labels = string_map(o->getObject("Labels"));
    if (auto containers = o->getObject("Containers"))
        for (const auto& [id, endpoint] : *containers) n.containers.push_back(id);
    return n;
}

VolumeInfo volume_of(const Object::Ptr& o) {
    VolumeInfo v;
    v.name = str(o, "Name");
    v.driver = str(o, "Driver");
    v.created = str(o, "CreatedAt");
    v.labels = string_map(o->getObject("Labels"));
    return v;
}

std::string filters_query(const Filters& filters) {
    return filters.empty() ? std::string() : "?filters=" + url_encode(encode_filters(filters));
}

}  // namespace

std::vector<NetworkInfo> Client::list_networks(const Filters& filters) {
    auto array = parse_array(impl_->call("GET", "/networks" + filters_query(filters)).body, "GET /networks");
    std::vector<NetworkInfo> result;
    for (std::size_t i = 0; i < array->size(); ++i) {
        auto o = array->getObject(static_cast<unsigned>(i));
        if (!o) throw ProtocolError(200, "", "GET /networks: an entry is not an object");
        result.push_back(network_of(o));
    }
    return result;
}

NetworkInfo Client::inspect_network(const std::string& id) {
    auto what = "GET /networks/" + id;
    auto n = network_of(parse_object(impl_->call("GET", "/networks/" + url_encode(id)).body, what));
    if (n.id.empty()) throw ProtocolError(200, "", what + ": the engine returned no Id");
    return n;
}

void Client::remove_network(const std::string& id) {
    impl_->call("DELETE", "/networks/" + url_encode(id), "", {200, 204});
}

std::vector<VolumeInfo> Client::list_volumes(const Filters& filters) {
    auto o = parse_object(impl_->call("GET", "/volumes" + filters_query(filters)).body, "GET /volumes");
    std::vector<VolumeInfo> result;
    if (auto volumes = o->getArray("Volumes")) {  // null when there are none
        for (std::size_t i = 0; i < volumes->size(); ++i) {
            auto v = volumes->getObject(static_cast<unsigned>(i));
            if (!v) throw ProtocolError(200, "", "GET /volumes: an entry is not an object");
            result.push_back(volume_of(v));
        }
    }
    return result;
}

VolumeInfo Client::inspect_volume(const std::string& name) {
    auto what = "GET /volumes/" + name;
    auto v = volume_of(parse_object(impl_->call("GET", "/volumes/" + url_encode(name)).body, what));
    if (v.name.empty()) throw ProtocolError(200, "", what + ": the engine returned no Name");
    return v;
}

void Client::remove_volume(const std::string& name) {
    impl_->call("DELETE", "/volumes/" + url_encode(name), "", {204});
}

}  // namespace reaper
