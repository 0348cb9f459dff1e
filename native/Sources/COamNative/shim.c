/* Placeholder so SwiftPM builds the C module that exposes include/oam_native.h to Swift. */
#include "oam_native.h"
