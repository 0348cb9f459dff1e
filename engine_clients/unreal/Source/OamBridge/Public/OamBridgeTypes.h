// OamBridgeTypes.h - Blueprint structs of the OamBridge plugin (NPC config, tools, turn results, errors).
#pragma once

#include "CoreMinimal.h"

#include "OamBridgeTypes.generated.h"

/** An error from the bridge: Code is the protocol's string code ("unknown_npc", "cancelled", "transport" when the bridge is gone, "no_bridge" when it never started, ...). */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamError
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Code;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Message;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	bool bRetryable = false;
};

/** npc/create persona. */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamPersona
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Name;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Role;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FString> Traits;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString SpeechStyle;
};

/** One argument of a tool or a decision option. Type: "string", "integer", "number" or "boolean". */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamToolParameter
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Name;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Type = TEXT("string");

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Description;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	bool bRequired = true;

	/** Allowed values (strings); empty: any. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FString> Enum;
};

/** A tool the NPC may call; the game answers OnToolCall with SubmitToolOutput / SubmitToolError. */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamTool
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Name;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Description;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FOamToolParameter> Parameters;

	/** A full JSON Schema for the arguments ({"type":"object",...}); when set, Parameters is ignored. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge", AdvancedDisplay)
	FString ParametersSchemaJson;
};

/** An NPC's npc/create parameters. */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamNpcConfig
{
	GENERATED_BODY()

	/** Unique among the game's NPCs; empty: the owning actor's name. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString NpcId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge", meta = (MultiLine = true))
	FString Instructions;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FOamPersona Persona;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FOamTool> Tools;

	/** World facts scoped by tag reach the NPCs carrying the tag. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FString> Tags;

	/** Lines said instead when the model's guardrails block a turn (guardrail "fallback" or "retry"). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FString> GuardrailFallbacks;

	/** Lines said instead when the model refuses. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FString> RefusalFallbacks;

	/** Guardrail policy of this NPC's Respond: "fail", "fallback", "retry"; empty: the subsystem's DefaultGuardrail. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Guardrail;

	/** "auto" (empty), "llama", "scripted", "native". */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge", AdvancedDisplay)
	FString Engine;

	/** Further npc/create params as a JSON object (model, options, script, ...); merged last. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge", AdvancedDisplay)
	FString ExtraParamsJson;
};

/** One option of a decision (npc/decide). */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamDecisionOption
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Name;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Description;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	TArray<FOamToolParameter> Parameters;
};

/** A turn as far as it went: while streaming, Delta is the new text (bIsReset: discard what was shown); when completed, Text is the answer. */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamTurnResult
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString NpcId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString TurnId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Text;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Delta;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	bool bIsReset = false;

	/** "stop", "length", "fallback", "retried_as_text", "prewarmed", ... */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString FinishReason;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	int32 WorldRevision = 0;

	/** The tool calls the turn made, with their outputs (JSON array). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString ToolCallsJson;

	/** The whole turn/completed params. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge", AdvancedDisplay)
	FString CompletedJson;
};

/** A completed decision: Choice is one of the options' names. */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamDecision
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString TurnId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Choice;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString Reasoning;

	/** The option's arguments as a JSON object; empty for an option without parameters. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString ArgumentsJson;
};

/** A tool call the game must answer (SubmitToolOutput / SubmitToolError with CallId). */
USTRUCT(BlueprintType)
struct OAMBRIDGE_API FOamToolCall
{
	GENERATED_BODY()

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString NpcId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString TurnId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString CallId;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString ToolName;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "OAM Bridge")
	FString ArgumentsJson;
};
