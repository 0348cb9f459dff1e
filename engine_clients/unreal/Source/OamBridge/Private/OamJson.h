// OamJson.h - conversions between the Unreal types and the core's JSON (private to the plugin).
#pragma once

#include "CoreMinimal.h"
#include "OamBridgeTypes.h"

#include <string>
#include <vector>

#include "oam_client.h"

namespace OamJson
{
inline FString ToFString(const std::string& S) { return FString(UTF8_TO_TCHAR(S.c_str())); }
inline std::string ToStd(const FString& S) { return std::string(TCHAR_TO_UTF8(*S)); }
inline FString Dump(const oam::json& J) { return ToFString(J.dump(-1, ' ', false, oam::json::error_handler_t::replace)); }
inline std::string Str(const oam::json& Params, const char* Key) { return oam::stringField(Params, Key); }

// "" -> Fallback; invalid JSON -> a discarded value (is_discarded()).
inline oam::json Parse(const FString& Text, oam::json Fallback)
{
	if (Text.TrimStartAndEnd().IsEmpty())
	{
		return Fallback;
	}
	return oam::json::parse(ToStd(Text), nullptr, false);
}

inline std::vector<std::string> ToStdList(const TArray<FString>& Strings)
{
	std::vector<std::string> Out;
	for (const FString& S : Strings)
	{
		Out.push_back(ToStd(S));
	}
	return Out;
}

inline FOamError MakeError(const FString& Code, const FString& Message)
{
	FOamError E;
	E.Code = Code;
	E.Message = Message;
	return E;
}

inline FOamError ToError(const oam::BridgeError& B)
{
	FOamError E = MakeError(ToFString(B.code), ToFString(B.what()));
	E.bRetryable = B.retryable;
	return E;
}

oam::json ParametersSchema(const TArray<FOamToolParameter>& Parameters);
oam::json ToolJson(const FOamTool& Tool);  // {"name","description","parameters"}; discarded parameters on a bad schema
oam::json DecisionOptionsJson(const TArray<FOamDecisionOption>& Options);
// npc/create params of Config for NpcId; a discarded json (and Error set) when ExtraParamsJson or a schema is not valid JSON.
oam::json CreateParams(const FOamNpcConfig& Config, const FString& NpcId, FString& Error);
FOamTurnResult TurnResult(const std::string& NpcId, const std::string& TurnId, const oam::json& Completed);
FOamDecision Decision(const std::string& TurnId, const oam::json& Completed);
}  // namespace OamJson
