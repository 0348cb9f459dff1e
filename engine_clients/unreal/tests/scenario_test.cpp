// scenario_test.cpp - runs engine_clients/scenario.json step by step against the real bridge
// with the oam C++ core, with the checks of engine_clients/shell/test.sh, plus the core's
// own features (every typed helper, the three tool-handler kinds, transport failures).
//
// usage: scenario_test SCENARIO_JSON   (bridge command: $OAM_BRIDGE_CMD, run from the repo root)
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>

#include "oam_client.h"
#include "oam_process.h"

using oam::json;
using namespace std::chrono_literals;

static int failures = 0;
static void ok(const std::string& what) { std::cout << "ok   - " << what << '\n'; }
static void bad(const std::string& what) {
    std::cout << "FAIL - " << what << '\n';
    ++failures;
}
static void check(bool cond, const std::string& what, const std::string& detail = "") {
    if (cond) ok(what);
    else bad(what + (detail.empty() ? "" : ": " + detail));
}

template <class T>
static std::optional<T> getWithin(std::shared_future<T> f, std::chrono::seconds t = 20s) {
    if (f.wait_for(t) != std::future_status::ready) return std::nullopt;
    return f.get();
}

static json g_scenario;
static json stepParams(const std::string& name) {
    for (const auto& s : g_scenario["steps"])
        if (s["name"] == name) return s["request"].value("params", json::object());
    throw std::runtime_error("no scenario step " + name);
}

static std::string dump(const std::vector<oam::Event>& evs) {
    json a = json::array();
    for (const auto& e : evs) a.push_back({{"method", e.method}, {"params", e.params}});
    return a.dump();
}

// The checks every turn's events get: turn/started first, seq 0,1,2,... gap-free, the same
// npcId and turnId on every event, exactly one terminal event and it is last.
static void checkTurnShape(const std::string& label, const oam::Turn& turn) {
    const auto evs = turn.events();
    bool seqOk = !evs.empty(), idsOk = true;
    int terminals = 0;
    for (std::size_t i = 0; i < evs.size(); ++i) {
        if (evs[i].seq() != static_cast<std::int64_t>(i)) seqOk = false;
        if (evs[i].turnId() != turn.turnId() || evs[i].npcId() != turn.npcId()) idsOk = false;
        if (evs[i].isTerminal()) ++terminals;
    }
    check(!evs.empty() && evs.front().method == "turn/started", label + ": started first", dump(evs));
    check(seqOk, label + ": seq 0,1,2,... without gaps", dump(evs));
    check(idsOk, label + ": every event has npcId " + turn.npcId() + " and turnId " + turn.turnId(), dump(evs));
    check(terminals == 1 && evs.back().isTerminal(), label + ": exactly one terminal event, last", dump(evs));
}

// Waits for a turn's outcome: the turn/completed params, or nullopt (reported) on failure or timeout.
static std::optional<json> finished(const std::string& label, const oam::Turn& turn) {
    try {
        auto c = getWithin(turn.completion());
        if (!c) bad(label + ": no terminal event within 20 s");
        return c;
    } catch (const oam::BridgeError& e) {
        bad(label + ": failed: " + e.code + " " + e.what());
        return std::nullopt;
    }
}

// The params of a step without the listed keys (the rest go to a typed helper as options).
static json without(json params, std::initializer_list<const char*> keys) {
    for (const char* k : keys) params.erase(k);
    return params;
}

// The game layer's steps (world_set ... world_delete), each with the checks its "expect" describes.
static void runGameLayer(oam::Client& client) {
    try {
        const json set = stepParams("world_set");
        json r = client.worldSet(set["key"], set["value"], without(set, {"key", "value"})).get();
        check(r["revision"] == 1, "world_set: revision 1", r.dump());

        const json create = stepParams("create_guard");
        r = client.createNpc(create).get();
        check(r["npcId"] == "guard" && r["engine"] == "scripted", "create_guard", r.dump());
        // expected values come from the guard's script and fallbacks
        const json decision = create["script"][0]["json"];
        const std::string fallbackLine = create["fallbacks"]["guardrailViolation"][0];
        const std::string guardLine = create["script"][2]["text"];

        const json scoped = stepParams("world_set_scoped");
        r = client.worldSet(scoped["key"], scoped["value"], without(scoped, {"key", "value"})).get();
        check(r["revision"] == 2, "world_set_scoped: revision 2", r.dump());

        r = client.worldGet(stepParams("world_get_for_npc")["npcId"]).get();
        const json gate = {{"key", "gate"}, {"value", "closed"}, {"npcIds", nullptr}, {"tags", json::array({"gate"})},
                           {"lore", false}};
        check(r["revision"] == 2 && r["facts"] == json::array({gate}),
              "world_get_for_npc: revision 2, exactly gate=closed (tags [gate], npcIds null, lore false)", r.dump());

        // decide: a decision turn
        const json d = stepParams("decide");
        auto turn = client.decide(d["npcId"], d["situation"], d["options"], without(d, {"npcId", "situation", "options"}));
        auto tid = getWithin(turn->accepted());
        check(tid && !tid->empty() && turn->kind() == "decide", "decide: result has a turnId", tid.value_or("(none)"));
        auto c = finished("decide", *turn);
        checkTurnShape("decide", *turn);
        auto evs = turn->events();
        bool onlyJson = true;
        for (std::size_t i = 1; i + 1 < evs.size(); ++i) onlyJson &= evs[i].method == "turn/partialJson";
        check(!evs.empty() && evs.front().params.value("kind", "") == "decide", "decide: turn/started kind=decide",
              dump(evs));
        check(onlyJson, "decide: only turn/partialJson streams", dump(evs));
        check(c && (*c)["json"]["choice"] == decision["choice"] && (*c)["json"]["reasoning"] == decision["reasoning"] &&
                  (*c)["worldRevision"] == 2,
              "decide: completed json.choice=question, json.reasoning, worldRevision=2", c ? c->dump() : "");

        // guardrail_fallback: the scripted guardrail_violation becomes the fallback line
        const json g = stepParams("guardrail_fallback");
        turn = client.respond(g["npcId"], g["prompt"], without(g, {"npcId", "prompt"}));
        c = finished("guardrail_fallback", *turn);
        checkTurnShape("guardrail_fallback", *turn);
        evs = turn->events();
        check(!evs.empty() && evs.front().params.value("kind", "") == "respond" && evs.front().params["speaker"].is_null(),
              "guardrail_fallback: turn/started kind=respond, speaker null", dump(evs));
        bool warned = false;
        if (c && (*c)["warnings"].is_array() && !(*c)["warnings"].empty() && (*c)["warnings"][0].is_string())
            warned = (*c)["warnings"][0].get<std::string>().rfind("guardrail_violation", 0) == 0;
        check(c && (*c)["text"] == fallbackLine && (*c)["finishReason"] == "fallback" && warned &&
                  turn->text() == fallbackLine,
              "guardrail_fallback: completed with the fallback line, finishReason fallback, warnings[0] guardrail_violation",
              c ? c->dump() : "");

        // npc_to_npc: the keeper speaks to the guard (keeper has no persona: its id is its name)
        const json n = stepParams("npc_to_npc");
        turn = client.respond(n["npcId"], n["prompt"], without(n, {"npcId", "prompt"}));
        c = finished("npc_to_npc", *turn);
        checkTurnShape("npc_to_npc", *turn);
        evs = turn->events();
        std::string deltas;
        for (const auto& e : evs)
            if (e.method == "turn/textDelta") deltas += e.params["delta"].get<std::string>();
        check(!evs.empty() && evs.front().params["speaker"] == "keeper" && turn->speaker() == std::string("keeper"),
              "npc_to_npc: turn/started speaker=keeper, Turn::speaker()", dump(evs));
        check(c && (*c)["text"] == guardLine && deltas == guardLine, "npc_to_npc: completed text, deltas concatenate",
              c ? c->dump() : "");

        // prewarm
        turn = client.prewarm(stepParams("prewarm")["npcId"]);
        tid = getWithin(turn->accepted());
        check(tid && !tid->empty() && turn->kind() == "prewarm", "prewarm: result has a turnId", tid.value_or("(none)"));
        c = finished("prewarm", *turn);
        checkTurnShape("prewarm", *turn);
        evs = turn->events();
        check(evs.size() == 2 && evs[0].params.value("kind", "") == "prewarm" && evs[0].params["prompt"] == "",
              "prewarm: turn/started kind=prewarm, then turn/completed", dump(evs));
        check(c && (*c)["finishReason"] == "prewarmed" && (*c)["steps"] == 0 && (*c)["text"] == "",
              "prewarm: finishReason prewarmed, steps 0, text \"\"", c ? c->dump() : "");

        // set_tags, then the guard sees the tavern's fact too
        const json t = stepParams("set_tags");
        r = client.setTags(t["npcId"], t["tags"].get<std::vector<std::string>>()).get();
        check(r == json::object(), "set_tags: result {}", r.dump());
        r = client.worldGet(stepParams("world_get_after_tags")["npcId"]).get();
        std::vector<std::string> keys;
        for (const auto& f : r["facts"]) keys.push_back(f["key"]);
        check(keys == std::vector<std::string>{"gate", "weather"}, "world_get_after_tags: gate, weather (sorted by key)",
              r.dump());

        r = client.worldDelete(stepParams("world_delete")["key"]).get();
        check(r["revision"] == 3 && r["deleted"] == true, "world_delete: revision 3, deleted", r.dump());
    } catch (const std::exception& e) {
        bad(std::string("game layer: ") + e.what());
    }
}

// Scenario steps plus extras.
static void runScenario(const std::vector<std::string>& command) {
    std::mutex logMu;
    std::vector<std::string> stderrLines;
    oam::ClientOptions opts;
    opts.command = command;
    opts.onLog = [&](const std::string& line) {
        std::lock_guard<std::mutex> lock(logMu);
        stderrLines.push_back(line);
        if (std::getenv("OAM_TEST_VERBOSE")) std::cerr << "[bridge] " << line << '\n';
    };
    std::mutex subMu;
    std::vector<json> submitResults;
    opts.onToolSubmitted = [&](const oam::ToolCall& call, const oam::Response& r) {
        std::lock_guard<std::mutex> lock(subMu);
        submitResults.push_back({{"name", call.name}, {"ok", r.ok()}, {"result", r.result},
                                 {"error", r.ok() ? "" : r.error->code}});
    };
    oam::Client client(opts);

    // 1. initialize
    try {
        const json p = stepParams("initialize");
        json r = client.initialize(p["clientInfo"]["name"], p["clientInfo"]["version"], p["protocolVersion"]).get();
        check(r["protocolVersion"] == 1 && r["serverInfo"]["name"].is_string(), "initialize", r.dump());
    } catch (const std::exception& e) {
        bad(std::string("initialize: ") + e.what());
    }

    // 2. create keeper (tool handler registered by name, before the turn)
    std::mutex argMu;
    json seenArgs;
    client.registerTool("check_inventory", [&](const json& args) {
        std::lock_guard<std::mutex> lock(argMu);
        seenArgs = args;
        return json{{"count", 3}};
    });
    std::atomic<int> globalDeltas{0};
    client.on("turn/textDelta", [&](const oam::Event&) { ++globalDeltas; });
    try {
        json r = client.createNpc(stepParams("create_keeper")).get();
        check(r["npcId"] == "keeper" && r["engine"] == "scripted", "create", r.dump());
    } catch (const std::exception& e) {
        bad(std::string("create: ") + e.what());
    }

    // 3. respond with a tool call answered by the registered handler
    {
        const json p = stepParams("respond_with_tool");
        json rest = p;
        rest.erase("npcId");
        rest.erase("prompt");
        auto turn = client.respond(p["npcId"], p["prompt"], rest);
        auto tid = getWithin(turn->accepted());
        check(tid && tid->rfind("turn_", 0) == 0, "tool turn: respond returned a turnId", tid.value_or("(none)"));
        std::optional<json> done;
        try {
            done = getWithin(turn->completion());
        } catch (const oam::BridgeError& e) {
            bad(std::string("tool turn failed: ") + e.code + " " + e.what());
        }
        check(done.has_value(), "tool turn: completed within 20 s");
        checkTurnShape("tool turn", *turn);
        const auto evs = turn->events();
        const std::string E = dump(evs);
        std::string reqCallId, deltas;
        bool completedOut = false;
        for (const auto& e : evs) {
            if (e.method == "turn/toolCallRequested" && e.params["name"] == "check_inventory" &&
                e.params["arguments"] == json{{"item", "ale"}})
                reqCallId = e.params["callId"];
            if (e.method == "turn/toolCallCompleted" && !reqCallId.empty() && e.params["callId"] == reqCallId &&
                e.params["output"] == json{{"count", 3}})
                completedOut = true;
            if (e.method == "turn/textDelta") deltas += e.params["delta"].get<std::string>();
        }
        check(!reqCallId.empty(), "tool turn: toolCallRequested check_inventory(ale)", E);
        {
            std::lock_guard<std::mutex> lock(argMu);
            check(seenArgs == json{{"item", "ale"}}, "tool turn: handler got the arguments", seenArgs.dump());
        }
        {
            std::lock_guard<std::mutex> lock(subMu);
            check(submitResults.size() == 1 && submitResults[0]["ok"] == true &&
                      submitResults[0]["result"] == json{{"accepted", true}},
                  "submit accepted", json(submitResults).dump());
        }
        check(completedOut, "tool turn: toolCallCompleted same callId, output {\"count\":3}", E);
        check(deltas == "We have 3 barrels of ale.", "tool turn: deltas concatenate to text", deltas);
        check(turn->text() == "We have 3 barrels of ale.", "tool turn: Turn::text() is the final text", turn->text());
        check(globalDeltas.load() > 0, "tool turn: client.on(\"turn/textDelta\") saw the deltas");
        if (done) {
            const json& c = *done;
            check(c["text"] == "We have 3 barrels of ale." && c["toolCalls"][0]["name"] == "check_inventory" &&
                      c["toolCalls"][0]["output"] == json{{"count", 3}} && evs.back().method == "turn/completed",
                  "tool turn: completed", c.dump());
        }
    }

    // 4. schema turn
    {
        const json p = stepParams("schema_turn");
        auto turn = client.respond(p["npcId"], p["prompt"], {{"schema", p["schema"]}});
        try {
            auto c = getWithin(turn->completion());
            check(c && (*c)["json"] == json{{"mood", "happy"}, {"line", "Welcome!"}}, "schema turn: completed json",
                  c ? c->dump() : "timeout");
        } catch (const oam::BridgeError& e) {
            bad(std::string("schema turn failed: ") + e.code);
        }
        checkTurnShape("schema turn", *turn);
    }

    // 5. cancel after the first delta (the callback runs on the reader thread: it must not
    //    block on the cancel future, so it only stores it)
    {
        const json p = stepParams("cancel_turn");
        std::mutex cmu;
        std::optional<std::future<json>> cancelFut;
        std::promise<void> finished;
        auto finishedF = finished.get_future();
        oam::Turn::Callbacks cbs;
        cbs.onEvent = [&](const oam::Event& e) {
            std::lock_guard<std::mutex> lock(cmu);
            if (e.method == "turn/textDelta" && !cancelFut) cancelFut = client.cancel(e.npcId());
        };
        cbs.onFinished = [&](const oam::Turn&) { finished.set_value(); };
        auto turn = client.respond(p["npcId"], p["prompt"], json::object(), cbs);
        std::string code = "(none)";
        try {
            auto c = getWithin(turn->completion());
            code = c ? "completed!" : "timeout";
        } catch (const oam::BridgeError& e) {
            code = e.code;
        }
        check(finishedF.wait_for(10s) == std::future_status::ready, "cancel turn: onFinished called");
        check(code == "cancelled", "cancel turn: completion throws BridgeError cancelled", code);
        const auto evs = turn->events();
        bool anyDelta = false, anyCompleted = false;
        for (const auto& e : evs) {
            anyDelta |= e.method == "turn/textDelta";
            anyCompleted |= e.method == "turn/completed";
        }
        check(anyDelta && !anyCompleted && evs.back().method == "turn/failed" &&
                  evs.back().params["error"]["code"] == "cancelled",
              "cancel turn: failed cancelled", dump(evs));
        checkTurnShape("cancel turn", *turn);
        std::lock_guard<std::mutex> lock(cmu);
        if (!cancelFut) {
            bad("cancel lists turn: cancel was never sent");
        } else {
            try {
                json r = cancelFut->get();
                bool listed = false;
                for (const auto& t : r["cancelled"]) listed |= t == turn->turnId();
                check(listed, "cancel lists turn", r.dump());
            } catch (const std::exception& e) {
                bad(std::string("cancel lists turn: ") + e.what());
            }
        }
    }

    // 6-7. transcript, restore as keeper2
    try {
        json save = client.transcript("keeper").get();
        check(save.is_object(), "transcript is an object", save.dump().substr(0, 200));
        json r = client.restore(save, "keeper2").get();
        check(r["npcId"] == "keeper2" && r["turns"].get<int>() >= 2, "restore", r.dump());
    } catch (const std::exception& e) {
        bad(std::string("transcript/restore: ") + e.what());
    }

    // world_set ... world_delete: world facts, a decision, guardrail fallback, NPC-to-NPC, prewarm, tags
    runGameLayer(client);

    // 8. unknown npc
    {
        const json p = stepParams("unknown_npc");
        auto turn = client.respond(p["npcId"], p["prompt"]);
        try {
            turn->accepted().get();
            bad("unknown npc accepted");
        } catch (const oam::BridgeError& e) {
            check(e.code == "unknown_npc" && e.rpcCode == -31020 && !e.retryable,
                  "unknown_npc error (code unknown_npc, rpcCode -31020)", e.code + " " + std::to_string(e.rpcCode));
        }
        try {
            turn->completion().get();
            bad("unknown npc: completion did not throw");
        } catch (const oam::BridgeError& e) {
            check(e.code == "unknown_npc", "unknown_npc: the turn's completion throws it too", e.code);
        }
    }

    // extras: the remaining typed helpers and tool-handler kinds
    try {
        json l = client.list().get();
        bool k2 = false;
        for (const auto& n : l["npcs"]) k2 |= n["npcId"] == "keeper2";
        check(k2, "list shows keeper2", l.dump());
        json t = client.countTokens("How much for a room?", {{"npcId", "keeper"}}).get();
        check(t["tokens"].is_number_integer() && t["tokens"].get<int>() > 0, "countTokens", t.dump());
        json s = client.engineStatus().get();
        check(s["engines"].is_array() && !s["engines"].empty(), "engineStatus", s.dump());
        check(client.reset("keeper2").get() == json::object(), "reset");
        check(client.deleteNpc("keeper2").get() == json::object(), "deleteNpc");
        // prewarm with who speaks next and how that line starts, then with a prefix only (the player)
        auto warm = client.prewarm("keeper", "Greta", "Heard about");
        auto wc = getWithin(warm->completion());
        auto wevs = warm->events();
        check(wc && (*wc)["finishReason"] == "prewarmed" && !wevs.empty() && wevs[0].params["prompt"] == "Heard about" &&
                  wevs[0].params["speaker"] == "Greta" && warm->speaker() == std::string("Greta"),
              "prewarm with a speaker and a promptPrefix: turn/started carries both", dump(wevs));
        warm = client.prewarm("keeper", "", "Well,");
        wc = getWithin(warm->completion());
        wevs = warm->events();
        check(wc && (*wc)["finishReason"] == "prewarmed" && !wevs.empty() && wevs[0].params["prompt"] == "Well," &&
                  wevs[0].params["speaker"].is_null() && !warm->speaker(),
              "prewarm with a promptPrefix only: speaker null (the player)", dump(wevs));
        try {
            client.submitError("keeper", "call_nope", "x").get();
            bad("submit to an unknown call accepted");
        } catch (const oam::BridgeError& e) {
            check(e.code == "unknown_tool_call" && e.rpcCode == -31021, "submitError unknown call: unknown_tool_call",
                  e.code);
        }
        // async (reply callback, answered from another thread), future, and throwing handlers
        std::thread replier;
        client.registerToolAsync("t_async", [&](const oam::ToolCall& call, oam::ToolReply reply) {
            replier = std::thread([reply, call] {
                std::this_thread::sleep_for(20ms);
                reply.output({{"v", "async"}, {"callId", call.callId}});
            });
        });
        client.registerToolFuture("t_future", [](const oam::ToolCall&) {
            return std::async(std::launch::async, [] {
                std::this_thread::sleep_for(30ms);
                return json{{"v", "future"}};
            });
        });
        client.registerTool("t_throw", [](const json&) -> json { throw std::runtime_error("boom"); });
        const json empty = {{"type", "object"}, {"properties", json::object()}};
        client.createNpc({{"npcId", "smith"},
                          {"engine", "scripted"},
                          {"instructions", "You are the smith."},
                          {"tools",
                           {{{"name", "t_async"}, {"description", "a"}, {"parameters", empty}},
                            {{"name", "t_future"}, {"description", "f"}, {"parameters", empty}},
                            {{"name", "t_throw"}, {"description", "t"}, {"parameters", empty}}}},
                          {"script",
                           {{{"toolCalls",
                              {{{"name", "t_async"}, {"arguments", json::object()}},
                               {{"name", "t_future"}, {"arguments", json::object()}},
                               {{"name", "t_throw"}, {"arguments", json::object()}}}}},
                            {{"text", "Done."}}}}})
            .get();
        auto turn = client.respond("smith", "Make me a sword");
        auto c = getWithin(turn->completion());
        if (replier.joinable()) replier.join();
        json out = json::object();
        if (c)
            for (const auto& tc : (*c)["toolCalls"]) out[tc["name"].get<std::string>()] = tc;
        check(c && (*c)["text"] == "Done.", "tools: smith turn completed", c ? c->dump() : "timeout");
        check(out["t_async"]["output"]["v"] == "async", "tools: async reply-callback handler output", out.dump());
        check(out["t_future"]["output"] == json{{"v", "future"}}, "tools: future handler output", out.dump());
        check(out["t_throw"].value("error", json()).is_string() &&
                  out["t_throw"]["error"].get<std::string>().find("boom") != std::string::npos,
              "tools: a throwing handler submits an error", out.dump());
        checkTurnShape("smith turn", *turn);
    } catch (const std::exception& e) {
        bad(std::string("extras: ") + e.what());
    }

    // 9. shutdown, 10. exit -> status 0
    try {
        json r = client.shutdown().get();
        check(r.is_null(), "shutdown returns null", r.dump());
    } catch (const std::exception& e) {
        bad(std::string("shutdown: ") + e.what());
    }
    client.exit();
    const int rc = client.close(5000ms);
    check(rc == 0, "bridge exited 0", std::to_string(rc));
    check(!client.running(), "client not running after close");
    try {
        client.list().get();
        bad("request after close did not fail");
    } catch (const oam::BridgeError& e) {
        check(e.code == "transport", "request after close fails with a transport BridgeError", e.code);
    }
    // (the bridge is quiet on stderr here; the log callback is checked with the fake bridge below)
    std::lock_guard<std::mutex> lock(logMu);
    std::cout << "#    bridge stderr: " << stderrLines.size() << " lines\n";
}

// A fake bridge that dies: pending requests fail with a transport error, stderr is logged,
// close() returns its exit status.
static void runTransport() {
    std::mutex logMu;
    std::vector<std::string> lines;
    oam::ClientOptions opts;
    opts.command = {"sh", "-c", "echo fake-bridge-stderr >&2; read line; exit 3"};
    opts.onLog = [&](const std::string& l) {
        std::lock_guard<std::mutex> lock(logMu);
        lines.push_back(l);
    };
    oam::Client client(opts);
    auto f = client.initialize();
    auto turn = client.respond("keeper", "hi");
    std::string code = "(no error)";
    try {
        if (f.wait_for(10s) != std::future_status::ready) code = "timeout";
        else f.get();
    } catch (const oam::BridgeError& e) {
        code = e.code;
    }
    check(code == "transport", "transport: a pending request fails when the bridge exits", code);
    try {
        turn->completion().get();
    } catch (const oam::BridgeError& e) {
        code = e.code;
    }
    check(code == "transport", "transport: a pending turn fails too", code);
    check(client.close(2000ms) == 3, "transport: close() returns the exit status (3)");
    std::lock_guard<std::mutex> lock(logMu);
    bool seen = false;
    for (const auto& l : lines) seen |= l == "fake-bridge-stderr";
    check(seen, "transport: stderr line logged");

    // a bridge that closes its stdin early: writing gets EPIPE (no SIGPIPE kills us), the
    // request fails with a transport error once it exits
    {
        std::mutex m;
        std::condition_variable cv;
        std::vector<std::string> log2;
        oam::ClientOptions o;
        o.command = {"sh", "-c", "exec 0<&-; echo stdin-closed >&2; sleep 0.5; exit 4"};
        o.onLog = [&](const std::string& l) {
            std::lock_guard<std::mutex> lock(m);
            log2.push_back(l);
            cv.notify_all();
        };
        oam::Client c(o);
        {
            std::unique_lock<std::mutex> lk(m);
            cv.wait_for(lk, 5s, [&] { return !log2.empty(); });
        }
        auto f2 = c.list();
        std::string code2 = "(no error)";
        try {
            if (f2.wait_for(10s) != std::future_status::ready) code2 = "timeout";
            else f2.get();
        } catch (const oam::BridgeError& e) {
            code2 = e.code;
        }
        const int rc2 = c.close(2000ms);
        bool epipe = false;
        std::lock_guard<std::mutex> lk(m);
        for (const auto& l : log2) epipe |= l.find("writing to the bridge failed") != std::string::npos;
        check(epipe && code2 == "transport" && rc2 == 4,
              "transport: a write to a closed stdin is EPIPE, not SIGPIPE; the request fails", code2);
    }

    // the lines the client writes, as a fake bridge reads them (it echoes each to stderr): prewarm
    // sends speaker and promptPrefix only when given
    {
        std::mutex m;
        std::condition_variable cv;
        std::vector<json> sent;
        oam::ClientOptions o;
        o.command = {"sh", "-c", "while IFS= read -r l; do printf '%s\\n' \"$l\" >&2; done"};
        o.onLog = [&](const std::string& l) {
            json j = json::parse(l, nullptr, false);
            std::lock_guard<std::mutex> lock(m);
            if (j.is_object()) sent.push_back(std::move(j));
            cv.notify_all();
        };
        oam::Client c(o);
        c.prewarm("bram");
        c.prewarm("bram", "greta", "Quiet");
        c.prewarm("bram", "", "Well,");
        c.prewarm("bram", oam::Turn::Callbacks{});
        {
            std::unique_lock<std::mutex> lk(m);
            cv.wait_for(lk, 5s, [&] { return sent.size() >= 4; });
        }
        c.close(2000ms);
        std::lock_guard<std::mutex> lk(m);
        json params = json::array();
        for (const auto& s : sent) params.push_back(s.value("method", "") == "npc/prewarm" ? s["params"] : json());
        const json want = json::parse(R"([{"npcId": "bram"}, {"npcId": "bram", "speaker": "greta", "promptPrefix": "Quiet"},
            {"npcId": "bram", "promptPrefix": "Well,"}, {"npcId": "bram"}])");
        check(params == want, "requests: prewarm's params hold speaker and promptPrefix only when given", params.dump());
    }

    // a bridge that never exits on EOF is terminated after the close timeout
    oam::ClientOptions o2;
    o2.command = {"sh", "-c", "trap '' TERM; exec sleep 30"};
    o2.onLog = [](const std::string&) {};
    const auto t0 = std::chrono::steady_clock::now();
    int rc = 0;
    {
        oam::Client stuck(o2);
        rc = stuck.close(200ms);
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    check(rc != 0 && ms < 5000ms, "transport: a bridge that ignores EOF is killed on close", std::to_string(rc));

    try {
        oam::ClientOptions o3;
        o3.command = {"/nonexistent/oam-bridge"};
        oam::Client nope(o3);
        bad("spawning a missing program did not throw");
    } catch (const std::system_error& e) {
        ok(std::string("spawn failure throws std::system_error (") + e.what() + ")");
    }
}

int main(int argc, char** argv) {
    const std::string scenarioPath = argc > 1 ? argv[1] : "engine_clients/scenario.json";
    std::ifstream in(scenarioPath);
    g_scenario = json::parse(in, nullptr, false);
    if (g_scenario.is_discarded()) {
        std::cout << "FAIL - cannot read " << scenarioPath << '\n';
        return 1;
    }
    const char* cmd = std::getenv("OAM_BRIDGE_CMD");
    const auto command = oam::splitCommandLine(cmd ? cmd : ".venv/bin/python -m bridge --engine scripted");
    try {
        runScenario(command);
        runTransport();
    } catch (const std::exception& e) {
        bad(std::string("unexpected exception: ") + e.what());
    }
    std::cout << (failures ? "unreal core client: FAIL" : "unreal core client: PASS") << '\n';
    return failures ? 1 : 0;
}
