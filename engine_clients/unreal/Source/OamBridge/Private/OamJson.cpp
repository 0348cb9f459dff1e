// OamJson.cpp - the structs of OamBridgeTypes.h as protocol JSON.
#include "OamJson.h"

namespace OamJson
{
oam::json ParametersSchema(const TArray<FOamToolParameter>& Parameters)
{
	oam::json Properties = oam::json::object();
	oam::json Required = oam::json::array();
	for (const FOamToolParameter& P : Parameters)
	{
		oam::json Prop = {{"type", P.Type.IsEmpty() ? std::string("string") : ToStd(P.Type)}};
		if (!P.Description.IsEmpty())
		{
			Prop["description"] = ToStd(P.Description);
		}
		if (P.Enum.Num() > 0)
		{
			Prop["enum"] = ToStdList(P.Enum);
		}
		Properties[ToStd(P.Name)] = std::move(Prop);
		if (P.bRequired)
		{
			Required.push_back(ToStd(P.Name));
		}
	}
	return {{"type", "object"}, {"properties", std::move(Properties)}, {"required", std::move(Required)}};
}

oam::json ToolJson(const FOamTool& Tool)
{
	oam::json J = {{"name", ToStd(Tool.Name)}};
	if (!Tool.Description.IsEmpty())
	{
		J["description"] = ToStd(Tool.Description);
	}
	J["parameters"] = Tool.ParametersSchemaJson.IsEmpty() ? ParametersSchema(Tool.Parameters) : Parse(Tool.ParametersSchemaJson, nullptr);
	return J;
}

oam::json DecisionOptionsJson(const TArray<FOamDecisionOption>& Options)
{
	oam::json Out = oam::json::array();
	for (const FOamDecisionOption& O : Options)
	{
		oam::json J = {{"name", ToStd(O.Name)}, {"description", ToStd(O.Description)}};
		if (O.Parameters.Num() > 0)
		{
			J["parameters"] = ParametersSchema(O.Parameters);
		}
		Out.push_back(std::move(J));
	}
	return Out;
}

oam::json CreateParams(const FOamNpcConfig& Config, const FString& NpcId, FString& Error)
{
	oam::json Params = Parse(Config.ExtraParamsJson, oam::json::object());
	if (!Params.is_object())
	{
		Error = TEXT("ExtraParamsJson is not a JSON object");
		return oam::json(oam::json::value_t::discarded);
	}
	Params["npcId"] = ToStd(NpcId);
	if (!Config.Instructions.IsEmpty())
	{
		Params["instructions"] = ToStd(Config.Instructions);
	}
	const FOamPersona& P = Config.Persona;
	if (!P.Name.IsEmpty() || !P.Role.IsEmpty() || P.Traits.Num() > 0 || !P.SpeechStyle.IsEmpty())
	{
		oam::json Persona = oam::json::object();
		if (!P.Name.IsEmpty()) Persona["name"] = ToStd(P.Name);
		if (!P.Role.IsEmpty()) Persona["role"] = ToStd(P.Role);
		if (P.Traits.Num() > 0) Persona["traits"] = ToStdList(P.Traits);
		if (!P.SpeechStyle.IsEmpty()) Persona["speechStyle"] = ToStd(P.SpeechStyle);
		Params["persona"] = std::move(Persona);
	}
	if (Config.Tools.Num() > 0)
	{
		oam::json Tools = oam::json::array();
		for (const FOamTool& T : Config.Tools)
		{
			oam::json J = ToolJson(T);
			if (J["parameters"].is_discarded())
			{
				Error = FString(TEXT("tool ")) + T.Name + TEXT(": ParametersSchemaJson is not JSON");
				return oam::json(oam::json::value_t::discarded);
			}
			Tools.push_back(std::move(J));
		}
		Params["tools"] = std::move(Tools);
	}
	if (Config.Tags.Num() > 0)
	{
		Params["tags"] = ToStdList(Config.Tags);
	}
	if (Config.GuardrailFallbacks.Num() > 0 || Config.RefusalFallbacks.Num() > 0)
	{
		oam::json Fallbacks = oam::json::object();
		if (Config.GuardrailFallbacks.Num() > 0) Fallbacks["guardrailViolation"] = ToStdList(Config.GuardrailFallbacks);
		if (Config.RefusalFallbacks.Num() > 0) Fallbacks["refusal"] = ToStdList(Config.RefusalFallbacks);
		Params["fallbacks"] = std::move(Fallbacks);
	}
	if (!Config.Engine.IsEmpty())
	{
		Params["engine"] = ToStd(Config.Engine);
	}
	return Params;
}

FOamTurnResult TurnResult(const std::string& NpcId, const std::string& TurnId, const oam::json& Completed)
{
	FOamTurnResult R;
	R.NpcId = ToFString(NpcId);
	R.TurnId = ToFString(TurnId);
	R.Text = ToFString(Str(Completed, "text"));
	R.FinishReason = ToFString(Str(Completed, "finishReason"));
	R.WorldRevision = static_cast<int32>(oam::intField(Completed, "worldRevision"));
	R.ToolCallsJson = Dump(Completed.is_object() && Completed.contains("toolCalls") ? Completed["toolCalls"] : oam::json::array());
	R.CompletedJson = Dump(Completed);
	return R;
}

FOamDecision Decision(const std::string& TurnId, const oam::json& Completed)
{
	const oam::json Answer = Completed.is_object() && Completed.contains("json") ? Completed["json"] : oam::json();
	FOamDecision D;
	D.TurnId = ToFString(TurnId);
	D.Choice = ToFString(Str(Answer, "choice"));
	D.Reasoning = ToFString(Str(Answer, "reasoning"));
	if (Answer.is_object() && Answer.contains("arguments"))
	{
		D.ArgumentsJson = Dump(Answer["arguments"]);
	}
	return D;
}
}  // namespace OamJson
