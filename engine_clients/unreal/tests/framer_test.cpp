// framer_test.cpp - unit test of oam::LineFramer and oam::splitCommandLine.
#include <iostream>
#include <string>
#include <vector>

#include "oam_line_framer.h"
#include "oam_process.h"

static int failures = 0;

static void check(bool cond, const std::string& what) {
    std::cout << (cond ? "ok   - " : "FAIL - ") << what << '\n';
    if (!cond) ++failures;
}

static std::vector<std::string> run(oam::LineFramer& f, const std::vector<std::string>& reads, bool finish = true) {
    std::vector<std::string> lines;
    auto on = [&](std::string&& l) { lines.push_back(std::move(l)); };
    for (const auto& r : reads) f.feed(r, on);
    if (finish) f.finish(on);
    return lines;
}

using V = std::vector<std::string>;

int main() {
    {
        oam::LineFramer f;
        check(run(f, {"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n"}) == V{"{\"a\":1}", "{\"b\":2}", "{\"c\":3}"},
              "framer: several lines in one read");
    }
    {
        oam::LineFramer f;
        check(run(f, {"{\"a\"", ":1", "}\n{\"b\":", "2}\n"}) == V{"{\"a\":1}", "{\"b\":2}"},
              "framer: a line split across reads");
    }
    {
        oam::LineFramer f;
        check(run(f, {"one\r\ntwo\r", "\nthree\n"}) == V{"one", "two", "three"},
              "framer: \\r\\n stripped, also when \\r and \\n arrive in different reads");
    }
    {
        oam::LineFramer f;
        check(run(f, {"\n\r\n", "a\n\n\nb\n"}) == V{"a", "b"}, "framer: blank lines skipped");
    }
    {
        oam::LineFramer f;
        std::vector<std::string> bytes;
        for (char c : std::string("x\r\nyz\n")) bytes.emplace_back(1, c);
        check(run(f, bytes) == V{"x", "yz"}, "framer: one byte per read");
    }
    {
        oam::LineFramer f;
        auto lines = run(f, {"done\npartial"}, false);
        check(lines == V{"done"} && f.buffered() == 7, "framer: unterminated tail stays buffered");
        std::vector<std::string> tail;
        f.finish([&](std::string&& l) { tail.push_back(l); });
        check(tail == V{"partial"} && f.buffered() == 0, "framer: finish() hands out the unterminated tail");
    }
    {
        oam::LineFramer f(8);
        auto lines = run(f, {"short\n0123456789", "abcdef\nnext\n"});
        check(lines == V{"short", "next"} && f.droppedLines() == 1,
              "framer: an overlong line is dropped and reading resyncs at the next newline");
    }
    {
        oam::LineFramer f;
        const std::string big(1 << 20, 'x');
        auto lines = run(f, {big.substr(0, 1000), big.substr(1000) + "\n"});
        check(lines.size() == 1 && lines[0] == big, "framer: a 1 MiB line in two reads");
    }
    check(oam::splitCommandLine(" .venv/bin/python  -m bridge --engine scripted ") ==
              V{".venv/bin/python", "-m", "bridge", "--engine", "scripted"},
          "splitCommandLine: whitespace");
    check(oam::splitCommandLine(R"(sh -c 'echo "a b"' "x\"y" c\ d '')") == V{"sh", "-c", "echo \"a b\"", "x\"y", "c d", ""},
          "splitCommandLine: quotes and escapes");
    std::cout << (failures ? "framer_test: FAIL" : "framer_test: PASS") << '\n';
    return failures ? 1 : 0;
}
