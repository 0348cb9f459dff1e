// oam_client.h - C++17 client for oam-bridge (line-delimited JSON-RPC 2.0 over a child's
// stdin/stdout). Engine-agnostic: no Unreal headers. See ../../../README.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(THIRD_PARTY_INCLUDES_START)  // inside an Unreal build: silence its warnings-as-errors
THIRD_PARTY_INCLUDES_START
#include <nlohmann/json.hpp>
THIRD_PARTY_INCLUDES_END
#else
#include <nlohmann/json.hpp>
#endif

#include "oam_process.h"  // splitCommandLine

namespace oam {

using json = nlohmann::json;

// A JSON-RPC error response, a turn/failed event, or a transport failure (code "transport":
// the bridge exited or closed its stdout, or the client was closed).
class BridgeError : public std::runtime_error {
public:
    BridgeError(std::string code, int rpcCode, std::string message, bool retryable = false, json data = nullptr);
    static BridgeError fromRpcError(const json& error);      // {"code": int, "message", "data": {...}}
    static BridgeError fromTurnError(const json& error);     // turn/failed params.error
    static BridgeError transport(const std::string& message);

    std::string code;   // the stable string code (data.code), e.g. "unknown_npc"
    int rpcCode;        // the JSON-RPC integer code, e.g. -31020 (0 for transport errors)
    bool retryable;
    json data;          // error.data (or the turn's error object)
};

// The JSON-RPC integer code of a protocol string code; 0 when unknown.
int rpcCodeFor(const std::string& code);

// Lenient field access: the value when obj is an object holding key with that type, else def.
std::string stringField(const json& obj, const char* key, const std::string& def = "");
std::int64_t intField(const json& obj, const char* key, std::int64_t def = 0);
bool boolField(const json& obj, const char* key, bool def = false);

// A notification from the bridge: {"method": "turn/...", "params": {...}}.
struct Event {
    std::string method;
    json params;  // always an object
    std::string npcId() const { return stringField(params, "npcId"); }
    std::string turnId() const { return stringField(params, "turnId"); }
    std::int64_t seq() const { return intField(params, "seq", -1); }
    bool isTerminal() const { return method == "turn/completed" || method == "turn/failed"; }
};

// The outcome of a request, for the callback variant of request().
struct Response {
    json result;                       // null when error is set
    std::optional<BridgeError> error;
    bool ok() const { return !error.has_value(); }
};

// What a tool handler is given.
struct ToolCall {
    std::string npcId, turnId, callId, name;
    json arguments;
    std::int64_t timeoutMs = 0;
};

// Single-shot answer for an asynchronous tool handler; later calls are ignored. Copyable,
// callable from any thread. If it is never called the bridge times the call out.
class ToolReply {
public:
    void output(json value) const;
    void error(const std::string& message) const;
    struct State;
    explicit ToolReply(std::shared_ptr<State> state) : state_(std::move(state)) {}

private:
    std::shared_ptr<State> state_;
};

using Dispatcher = std::function<void(std::function<void()>)>;
using EventHandler = std::function<void(const Event&)>;
using LogHandler = std::function<void(const std::string&)>;
using SyncToolHandler = std::function<json(const json& arguments)>;
using CallbackToolHandler = std::function<void(const ToolCall& call, ToolReply reply)>;
using FutureToolHandler = std::function<std::future<json>(const ToolCall& call)>;

class Client;

// One turn (npc/respond, npc/decide or npc/prewarm): the events it streamed so far and its
// outcome. Thread-safe.
class Turn {
public:
    const std::string& npcId() const { return npcId_; }
    const std::string& kind() const { return kind_; }     // "respond", "decide" or "prewarm": the method
    // Who said the prompt (turn/started "speaker"): nullopt for the player, or before turn/started.
    std::optional<std::string> speaker() const;
    std::string turnId() const;                           // "" until the bridge accepted the turn
    std::shared_future<std::string> accepted() const { return accepted_; }  // turnId, or throws BridgeError
    // The turn/completed params, or throws BridgeError (turn/failed, request error, transport).
    // Ready on the reader thread, possibly before queued callbacks ran on your dispatcher.
    std::shared_future<json> completion() const { return completion_; }
    std::vector<Event> events() const;                    // every event of this turn, in order
    std::string text() const;                             // text so far (textDelta, honouring isReset)
    bool finished() const;

    // Internal; use Client::respond, decide or prewarm.
    struct Callbacks {
        EventHandler onEvent;                             // each event of this turn
        std::function<void(const Turn&)> onFinished;      // once; completion() is ready then
    };
    Turn(std::string npcId, Callbacks callbacks, std::string kind = "respond");

private:
    friend class Client;
    struct Access;
    mutable std::mutex mu_;
    std::string npcId_, kind_, turnId_, text_;
    std::optional<std::string> speaker_;
    std::vector<Event> events_;
    bool finished_ = false;
    Callbacks callbacks_;
    std::promise<std::string> acceptedP_;
    std::promise<json> completionP_;
    std::shared_future<std::string> accepted_;
    std::shared_future<json> completion_;
};

struct ClientOptions {
    std::vector<std::string> command;      // e.g. {"python", "-m", "bridge"}; see splitCommandLine
    std::string workingDirectory;          // empty: inherit
    // The bridge dies with the thread that constructs this client, even on SIGKILL (see
    // SpawnOptions::dieWithParent in oam_process.h): construct it on a long-lived thread.
    bool dieWithParent = true;
    // Runs event, turn, tool-handler and request callbacks. Default: inline on the reader
    // thread (then never block on a future of this client inside a callback).
    Dispatcher dispatcher;
    // The bridge's stderr lines, plus this client's own diagnostics ("oam-client: ..."),
    // called on the stderr reader thread or the reader thread. Default: std::cerr.
    LogHandler onLog;
    // Outcome of each automatic npc/submit made for a registered tool handler (dispatched).
    std::function<void(const ToolCall&, const Response&)> onToolSubmitted;
    std::chrono::milliseconds closeTimeout{5000};
    std::size_t maxLineBytes = 64u << 20;  // longer stdout lines are dropped and logged
};

class Client {
public:
    explicit Client(ClientOptions options);  // spawns the bridge; throws std::system_error
    ~Client();                               // close() if not done
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    // Generic JSON-RPC. The future yields the result or throws BridgeError. The callback
    // variant runs cb through the dispatcher.
    std::future<json> request(const std::string& method, json params = json::object());
    void request(const std::string& method, json params, std::function<void(const Response&)> cb);
    void notify(const std::string& method, json params = nullptr);

    // Typed helpers, one per protocol method.
    std::future<json> initialize(const std::string& clientName = "oam-cpp", const std::string& clientVersion = "1",
                                 int protocolVersion = 1);
    // npc/create params (npcId, instructions, persona, tools, tags, fallbacks, ...)
    std::future<json> createNpc(json params);
    // npc/respond; options are the other params (toolChoice, schema, maxToolRounds, speaker,
    // guardrail, ...).
    std::shared_ptr<Turn> respond(const std::string& npcId, const std::string& prompt, json options = json::object(),
                                  Turn::Callbacks callbacks = {});
    // npc/decide: the NPC picks one of choices ([{"name", "description", "parameters"?}, ...]);
    // extra: {"reasoning": bool, "remember": bool}. The turn's completion()["json"] is
    // {"reasoning", "choice", "arguments"?}.
    std::shared_ptr<Turn> decide(const std::string& npcId, const std::string& situation, json choices,
                                 json extra = json::object(), Turn::Callbacks callbacks = {});
    // npc/prewarm: a turn that prepares the NPC; completes with finishReason "prewarmed", steps 0.
    // speaker: who will speak to the NPC next (as respond's "speaker": another NPC's id or a name;
    // empty: the player); promptPrefix: how that line starts, when the game knows. Empty ones are
    // left out of the request.
    std::shared_ptr<Turn> prewarm(const std::string& npcId, const std::string& speaker = "",
                                  const std::string& promptPrefix = "", Turn::Callbacks callbacks = {});
    // npc/prewarm for the player's next line, with callbacks.
    std::shared_ptr<Turn> prewarm(const std::string& npcId, Turn::Callbacks callbacks);
    std::future<json> setTags(const std::string& npcId, const std::vector<std::string>& tags);  // npc/setTags
    // world/set; scope: {"tags": [...], "npcIds": [...], "lore": bool}, empty: every NPC, not lore.
    // The result is {"revision"}.
    std::future<json> worldSet(const std::string& key, json value, json scope = json::object());
    std::future<json> worldDelete(const std::string& key);      // {"revision", "deleted"}
    std::future<json> worldGet(const std::string& npcId = "");  // {"revision", "facts"}; npcId: what it sees
    std::future<json> submitOutput(const std::string& npcId, const std::string& callId, json output);
    std::future<json> submitError(const std::string& npcId, const std::string& callId, const std::string& error);
    std::future<json> cancel(const std::string& npcId);
    std::future<json> transcript(const std::string& npcId);
    std::future<json> restore(json save, const std::string& npcId = "");
    std::future<json> reset(const std::string& npcId);
    std::future<json> deleteNpc(const std::string& npcId);
    std::future<json> list();
    std::future<json> countTokens(const std::string& text, json target = json::object());  // {"npcId"} or {"engine"}
    std::future<json> engineStatus();
    std::future<json> shutdown();
    void exit();  // the exit notification

    // Events: per method ("turn/textDelta", ...) or "*" for all. Dispatched.
    void on(const std::string& method, EventHandler handler);

    // Tool handlers by tool name: on turn/toolCallRequested the client runs the handler (via
    // the dispatcher) and submits its output; a thrown exception submits an error.
    void registerTool(const std::string& name, SyncToolHandler handler);
    void registerToolAsync(const std::string& name, CallbackToolHandler handler);
    void registerToolFuture(const std::string& name, FutureToolHandler handler);  // waited on a helper thread
    void unregisterTool(const std::string& name);

    // Closes the bridge's stdin (it then exits 0 within a second), waits up to timeout, then
    // SIGTERM, then SIGKILL; joins all threads and fails what is still pending with a transport
    // BridgeError. Returns the exit status (128+signal if killed). Idempotent. Not from a
    // callback running on the reader thread.
    int close(std::optional<std::chrono::milliseconds> timeout = std::nullopt);
    bool running() const;
    long pid() const;

    struct Impl;

private:
    std::shared_ptr<Impl> impl_;
};

}  // namespace oam
