#pragma once
#include "UObject/Object.h"
// ULevel (Engine/Level.h): a persistent level or a streamed sublevel; its outermost object is
// the map's package.
class ULevel : public UObject {};
