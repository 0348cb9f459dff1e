// OamBridgeSubsystem.h - one oam-bridge process per game instance, for Blueprints and C++.
#pragma once

#include "CoreMinimal.h"
#include "Subsystems/GameInstanceSubsystem.h"
#include "Templates/UniquePtr.h"

#include "OamBridgeTypes.h"

#include "OamBridgeSubsystem.generated.h"

OAMBRIDGE_API DECLARE_LOG_CATEGORY_EXTERN(LogOamBridge, Log, All);

namespace oam
{
class Client;
}

// All are broadcast on the game thread.
// Kind: "respond", "decide" or "prewarm" (the method that started the turn). Speaker: who said the
// prompt, empty for the player.
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FiveParams(FOamTurnStartedSignature, const FString&, NpcId, const FString&, TurnId,
	const FString&, Kind, const FString&, Speaker, const FString&, Prompt);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FourParams(FOamTextDeltaSignature, const FString&, NpcId, const FString&, TurnId,
	const FString&, Delta, bool, bIsReset);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FiveParams(FOamToolCallRequestedSignature, const FString&, NpcId,
	const FString&, TurnId, const FString&, CallId, const FString&, ToolName, const FString&, ArgumentsJson);
// FinishReason: "stop", "length", "fallback", "retried_as_text", "prewarmed", ...; WorldRevision: the
// world revision the turn's last model step saw.
DECLARE_DYNAMIC_MULTICAST_DELEGATE_SixParams(FOamTurnCompletedSignature, const FString&, NpcId, const FString&,
	TurnId, const FString&, Text, const FString&, CompletedJson, const FString&, FinishReason, int32, WorldRevision);
// A completed npc/decide: Choice is one of the options; Reasoning empty when not asked for;
// ArgumentsJson "" for an option without parameters.
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FiveParams(FOamDecisionSignature, const FString&, NpcId, const FString&, TurnId,
	const FString&, Choice, const FString&, Reasoning, const FString&, ArgumentsJson);
// world/set or a world/delete that deleted: the world's revision after the change.
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FOamWorldChangedSignature, const FString&, Key, int32, Revision);
// Answers of the asynchronous save-game calls, on the game thread. bSuccess false: Error says why
// (never an empty save that looks like a success).
DECLARE_DYNAMIC_DELEGATE_ThreeParams(FOamTranscriptSavedDelegate, bool, bSuccess, const FString&, SaveJson, const FOamError&, Error);
DECLARE_DYNAMIC_DELEGATE_ThreeParams(FOamTranscriptRestoredDelegate, bool, bSuccess, const FString&, NpcId, const FOamError&, Error);
DECLARE_DYNAMIC_DELEGATE_ThreeParams(FOamWorldFactsReadDelegate, bool, bSuccess, const FString&, WorldJson, const FOamError&, Error);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_FourParams(FOamTurnFailedSignature, const FString&, NpcId, const FString&, TurnId,
	const FString&, Code, const FString&, Message);

UCLASS(Config = Game)
class OAMBRIDGE_API UOamBridgeSubsystem : public UGameInstanceSubsystem
{
	GENERATED_BODY()

public:
	// Every constructor and the destructor are defined in the .cpp, where oam::Client is complete:
	// otherwise UHT defines the FVTableHelper one in the .gen.cpp, which cannot destroy the
	// TUniquePtr<oam::Client> (see Templates/UniquePtr.h; tests/uht_lite.py checks it).
	UOamBridgeSubsystem();
	UOamBridgeSubsystem(FVTableHelper& Helper);
	virtual ~UOamBridgeSubsystem() override;

	virtual void Initialize(FSubsystemCollectionBase& Collection) override;
	virtual void Deinitialize() override;

	/** npc/create. ExtraParamsJson: further npc/create params as a JSON object (tools, persona, engine, script, ...). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "ExtraParamsJson"))
	bool CreateNpc(const FString& NpcId, const FString& Instructions, const FString& ExtraParamsJson = TEXT(""));

	/** npc/respond. Streams OnTurnStarted / OnTextDelta / OnToolCallRequested, then OnTurnCompleted or OnTurnFailed (also when the request is refused, with an empty TurnId). OptionsJson: further params, e.g. {"guardrail":"fallback"}; without "guardrail", DefaultGuardrail applies. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "OptionsJson"))
	bool Respond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson = TEXT(""));

	/** npc/respond with a speaker: Speaker (another NPC's id, or any name) says Prompt to NpcId, which answers. OnTurnStarted reports the speaker's name. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "OptionsJson"))
	bool RespondToSpeaker(const FString& NpcId, const FString& Speaker, const FString& Prompt, const FString& OptionsJson = TEXT(""));

	/** npc/decide: the NPC picks one of OptionsJson ([{"name","description","parameters"?}, ...]) for Situation. Streams OnTurnStarted (Kind "decide"), then OnDecision and OnTurnCompleted, or OnTurnFailed. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "bReasoning,bRemember"))
	bool Decide(const FString& NpcId, const FString& Situation, const FString& OptionsJson, bool bReasoning = true, bool bRemember = false);

	/** npc/prewarm: prepares the NPC before the player reaches it. Ends with OnTurnCompleted (FinishReason "prewarmed"). Speaker: who will speak to it next (another NPC's id, or any name; empty: the player); PromptPrefix: how that line starts, when the game knows (OnTurnStarted reports both). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AdvancedDisplay = "Speaker,PromptPrefix"))
	bool Prewarm(const FString& NpcId, const FString& Speaker = TEXT(""), const FString& PromptPrefix = TEXT(""));

	/** npc/setTags: replaces the NPC's tags; world facts scoped by tag follow from its next model step. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SetTags(const FString& NpcId, const TArray<FString>& Tags);

	/** world/set with a text value. Tags and NpcIds both empty: every NPC sees it. bLore: recalled with the bridge's recall tool instead of shown in every prompt. OnWorldChanged follows. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AutoCreateRefTerm = "Tags,NpcIds", AdvancedDisplay = "NpcIds,bLore"))
	bool SetWorldFact(const FString& Key, const FString& Value, const TArray<FString>& Tags, const TArray<FString>& NpcIds, bool bLore = false);

	/** world/set with a JSON value (ValueJson: any JSON but null), e.g. {"rain":true}. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AutoCreateRefTerm = "Tags,NpcIds", AdvancedDisplay = "NpcIds,bLore"))
	bool SetWorldFactJson(const FString& Key, const FString& ValueJson, const TArray<FString>& Tags, const TArray<FString>& NpcIds, bool bLore = false);

	/** world/delete. OnWorldChanged follows when there was such a fact. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool DeleteWorldFact(const FString& Key);

	/** world/get: every fact, or those NpcId sees, as JSON text ({"revision","facts"}) for a save game. Asynchronous: OnDone gets it, or bSuccess false and the error. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge", meta = (AutoCreateRefTerm = "NpcId"))
	void ReadWorldFacts(const FString& NpcId, FOamWorldFactsReadDelegate OnDone);

	/** Sets every fact of ReadWorldFacts' text again (after loading a save). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool RestoreWorld(const FString& WorldJson);

	/** npc/submit with an output (OutputJson: any JSON value). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SubmitToolOutput(const FString& NpcId, const FString& CallId, const FString& OutputJson);

	/** npc/submit with an error the model sees. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool SubmitToolError(const FString& NpcId, const FString& CallId, const FString& Error);

	/** npc/cancel: the running and queued turns end with OnTurnFailed (Code "cancelled"). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	bool Cancel(const FString& NpcId);

	/** npc/transcript as JSON text for the save game. Asynchronous (the game thread never waits): OnDone gets the save, or bSuccess false with the error (unknown_npc, transport, no_bridge, ...). Blueprint nodes: Save NPC Transcript (OamAsyncActions.h). */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	void SaveTranscript(const FString& NpcId, FOamTranscriptSavedDelegate OnDone);

	/** npc/restore from SaveTranscript's text; NpcId empty keeps the saved id. Asynchronous: OnDone gets the restored NPC's id, or bSuccess false with the error. */
	UFUNCTION(BlueprintCallable, Category = "OAM Bridge")
	void RestoreTranscript(const FString& SaveJson, const FString& NpcId, FOamTranscriptRestoredDelegate OnDone);

	// The same for C++ (lambdas); Done runs on the game thread, or at once when there is no bridge.
	using FJsonDone = TFunction<void(bool bSuccess, const FString& Json, const FOamError& Error)>;
	void SaveTranscriptThen(const FString& NpcId, FJsonDone Done);
	void RestoreTranscriptThen(const FString& SaveJson, const FString& NpcId, FJsonDone Done);  // Json: the npcId
	void ReadWorldFactsThen(const FString& NpcId, FJsonDone Done);

	/** The shipped bridge of this platform inside the plugin (Binaries/ThirdParty/OamBridge/<Platform>/oam-bridge[.exe]), found from the plugin's base directory, else relative to the executable (packaged game); "" when there is none. */
	UFUNCTION(BlueprintPure, Category = "OAM Bridge")
	static FString FindShippedBridge();

	UFUNCTION(BlueprintPure, Category = "OAM Bridge")
	bool IsBridgeRunning() const;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamTurnStartedSignature OnTurnStarted;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamTextDeltaSignature OnTextDelta;

	/** Answer with SubmitToolOutput / SubmitToolError, unless a C++ handler is registered for the tool (GetClient()->registerTool), which answers by itself. */
	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamToolCallRequestedSignature OnToolCallRequested;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamTurnCompletedSignature OnTurnCompleted;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamTurnFailedSignature OnTurnFailed;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamDecisionSignature OnDecision;

	UPROPERTY(BlueprintAssignable, Category = "OAM Bridge")
	FOamWorldChangedSignature OnWorldChanged;

	/** A bridge command line for development (e.g. "python -m bridge" with BridgeWorkingDirectory); empty (the default): the shipped bridge, FindShippedBridge(). The environment variable OAM_BRIDGE_CMD overrides both. */
	UPROPERTY(Config, EditAnywhere, Category = "OAM Bridge")
	FString BridgeCommand;

	/** Arguments added after the shipped bridge's path, e.g. "--engine scripted" or "--model Models/npc.gguf". */
	UPROPERTY(Config, EditAnywhere, Category = "OAM Bridge")
	FString BridgeArguments;

	/** Working directory of a BridgeCommand, relative to the project directory. The shipped bridge runs in its own folder. */
	UPROPERTY(Config, EditAnywhere, Category = "OAM Bridge")
	FString BridgeWorkingDirectory;

	/** The guardrail policy of Respond and RespondToSpeaker when OptionsJson has none: "fail", "fallback" (the NPC's fallback line), "retry"; empty: the bridge's default ("fail"). */
	UPROPERTY(Config, EditAnywhere, Category = "OAM Bridge")
	FString DefaultGuardrail;

	/** The core client for C++ (tool handlers, other methods); null when the bridge did not start. */
	oam::Client* GetClient() const { return Client.Get(); }

private:
	bool StartRespond(const FString& NpcId, const FString& Prompt, const FString& OptionsJson, const FString& Speaker);

	TUniquePtr<oam::Client> Client;
	bool bClosing = false;
};
