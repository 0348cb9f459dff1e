// orphan_test.cpp - the "game" of the crash test: starts the bridge through the client, prints
// "bridge-pid PID" and waits to be killed. run_tests.sh kills it with SIGKILL and checks that the
// bridge is gone within 1 s (item 5 of issue 11: a crashing game never orphans the bridge).
//
// usage: orphan_test [--no-initialize] [--spawn-thread-lives] COMMAND...
//   default: COMMAND is the bridge; initialize is answered before the pid is printed.
//   --no-initialize: COMMAND is any program (e.g. one that ignores stdin EOF, which only the
//   parent-death signal can stop).
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "oam_client.h"

int main(int argc, char** argv) {
    bool initialize = true;
    int i = 1;
    for (; i < argc && std::string(argv[i]).rfind("--", 0) == 0; ++i) {
        if (std::string(argv[i]) == "--no-initialize") initialize = false;
    }
    oam::ClientOptions opts;
    for (; i < argc; ++i) opts.command.push_back(argv[i]);
    if (opts.command.empty()) {
        std::cerr << "usage: orphan_test [--no-initialize] COMMAND...\n";
        return 2;
    }
    oam::Client bridge(opts);
    if (initialize) bridge.initialize("orphan-test", "1.0").get();
    std::cout << "bridge-pid " << bridge.pid() << std::endl;
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the harness kills us
}
